"""Dense: a linear layer that stores its weight as (in, out).

x @ W with W (in, out) contiguous is a row-combination that runs markedly faster than
nn.Linear's x @ W^T for the small batches of step-by-step sampling (see docs/design.md), and no
slower for training. One
addmm for any number of leading dims keeps the bias add inside the product, which under
bfloat16 autocast also keeps the output bfloat16 (a separate float32 bias add would promote
it and cost a full pass over the activations).

Decoding may run its products in another dtype (bfloat16 sampling): `Dense.cast` converts the
weights once, the decoding state carries them, and `dense` applies them. For bfloat16 on the CPU
at batches of PACK_MIN_ROWS rows or more the weight is also prepacked once into oneDNN's own
layout for that batch (`pack`): oneDNN's bfloat16 matmul otherwise repacks W at every call.
"""
import functools

import torch
from torch import nn

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
        """(weight, bias) for products in `dtype` at `batch` rows: the parameters themselves when
        they already are of it, else detached copies converted once (decoding states carry them),
        the weight prepacked by `pack` where it can be."""
        if self.weight.dtype == dtype:
            return self.weight, self.bias
        return pack(self.weight.detach().to(dtype), batch), self.bias.detach().to(dtype)

    def extra_repr(self):
        return f"{self.weight.shape[0]} -> {self.weight.shape[1]}"


@functools.cache
def can_pack():
    """True where torch's oneDNN runs bfloat16 linears on this CPU with prepacked weights."""
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_is_mkldnn_bf16_supported")
            and ops._is_mkldnn_bf16_supported() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise"))


def pack(w, batch):
    """w (d_in, d_out) bfloat16 on the CPU -> the same product prepacked by oneDNN for `batch` rows
    (an opaque (d_out, d_in) tensor that `dense` and the C++ decoding step apply with
    torch.ops.mkldnn._linear_pointwise); w itself for other dtypes, devices, small batches or
    where oneDNN cannot."""
    if w.dtype != torch.bfloat16 or w.device.type != "cpu" or batch < PACK_MIN_ROWS or not can_pack():
        return w
    return torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), batch)


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
