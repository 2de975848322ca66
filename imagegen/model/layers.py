"""Dense: a linear layer that stores its weight as (in, out).

x @ W with W (in, out) contiguous is a row-combination that runs markedly faster than
nn.Linear's x @ W^T for the small batches of step-by-step sampling (see docs/design.md), and no
slower for training. One
addmm for any number of leading dims keeps the bias add inside the product, which under
bfloat16 autocast also keeps the output bfloat16 (a separate float32 bias add would promote
it and cost a full pass over the activations).

Decoding may run its products in another dtype (bfloat16 sampling): `Dense.cast` converts the
weights once, the decoding state carries them, and `dense` applies them. On the CPU at batches of
PACK_MIN_ROWS rows or more the weight is also prepacked once into oneDNN's own layout for that
batch (`pack`): always for bfloat16 (oneDNN's bfloat16 matmul otherwise repacks W at every call),
for float32 where that measures faster than addmm at the product's shape and batch (on an AVX-512
AMD EPYC about 2x from 16 rows: MKL's float32 products run well below oneDNN's there).
"""
import functools

import torch
from torch import nn

from .. import probe

PACK_MIN_ROWS = 5     # fewer rows: the C++ step's own bfloat16 loop (decode_linear), which streams W


class Dense(nn.Module):
    def __init__(self, d_in, d_out, std=0.02):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_in, d_out) * std)
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x):                                  # (..., d_in) -> (..., d_out)
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return out.view(*x.shape[:-1], out.shape[-1])

    def cast(self, dtype, batch=0):
        """(weight, bias) for products in `dtype` at `batch` rows: detached copies converted once
        (decoding states carry them), the weight prepacked by `pack` where it can be; the
        parameters themselves when they already are of dtype and the weight is not packed."""
        w = pack(self.weight.detach().to(dtype), batch)
        if self.weight.dtype == dtype and not w.is_mkldnn:
            return self.weight, self.bias
        return w, self.bias.detach().to(dtype)

    def extra_repr(self):
        return f"{self.weight.shape[0]} -> {self.weight.shape[1]}"


@functools.cache
def can_pack(dtype=torch.bfloat16):
    """True where torch's oneDNN runs linears in dtype (bfloat16 or float32) on this CPU with
    prepacked weights."""
    ops = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise")):
        return False
    if dtype == torch.bfloat16:
        return hasattr(ops, "_is_mkldnn_bf16_supported") and ops._is_mkldnn_bf16_supported()
    return dtype == torch.float32


def prepacked(w, batch):
    """oneDNN's prepacked layout of w (d_in, d_out) for `batch` rows (an opaque (d_out, d_in) tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), batch)


def packs_float32(batch, d_in, d_out):
    """Whether a float32 (d_in, d_out) product at `batch` rows is prepacked: where a probe
    (`imagegen.probe`, cached per machine) measures oneDNN's prepacked product faster than addmm by
    its margin; never with probes off."""
    def measure():
        g = torch.Generator().manual_seed(0)
        x, w, b = torch.randn(batch, d_in, generator=g), torch.randn(d_in, d_out, generator=g), torch.zeros(d_out)
        packed = prepacked(w, batch)
        with torch.no_grad():
            return probe.best_ms(lambda: torch.addmm(b, x, w), lambda: dense(x, (packed, b)), rounds=7)
    verdict = probe.decide(f"f32-pack:N{batch}:I{d_in}:O{d_out}", measure)
    return verdict is not None and verdict.chosen


def pack(w, batch):
    """w (d_in, d_out) on the CPU -> the same product prepacked by oneDNN for `batch` rows (an opaque
    (d_out, d_in) tensor that `dense` and the C++ decoding step apply with
    torch.ops.mkldnn._linear_pointwise): bfloat16 where oneDNN can, float32 where `packs_float32`;
    w itself otherwise (other dtypes and devices, fewer than PACK_MIN_ROWS rows)."""
    if w.device.type != "cpu" or batch < PACK_MIN_ROWS or not can_pack(w.dtype):
        return w
    if w.dtype == torch.float32 and not packs_float32(batch, *w.shape):
        return w
    return prepacked(w, batch)


def dense(x, weights):
    """x (..., d_in) through (weight, bias) from `Dense.cast`; x is converted to their dtype and
    the result (..., d_out) is of it (bfloat16 products accumulate in float32)."""
    w, b = weights
    x2 = x.reshape(-1, x.shape[-1]).to(w.dtype)
    if w.is_mkldnn:                                        # prepacked by `pack`
        out = torch.ops.mkldnn._linear_pointwise(x2.contiguous(), w, b, "none", [], "")
    else:
        out = torch.addmm(b, x2, w)
    return out.view(*x.shape[:-1], out.shape[-1])
