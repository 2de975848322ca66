"""Dense: a linear layer that stores its weight as (in, out).

x @ W with W (in, out) contiguous is a row-combination that runs markedly faster than
nn.Linear's x @ W^T for the small batches of step-by-step sampling (see docs/design.md), and no
slower for training. One
addmm for any number of leading dims keeps the bias add inside the product, which under
bfloat16 autocast also keeps the output bfloat16 (a separate float32 bias add would promote
it and cost a full pass over the activations).

Decoding may run its products in another dtype (bfloat16 sampling): `Dense.cast` converts the
weights once, the decoding state carries them, and `dense` applies them. On the CPU the weight may
also be laid out once for the batch (`pack`):
- from PACK_MIN_ROWS rows, prepacked into oneDNN's own layout: always for bfloat16 (oneDNN's
  bfloat16 matmul otherwise repacks W at every call), for float32 where that measures faster than
  addmm at the product's shape and batch (MKL's float32 products can run well below oneDNN's);
- below it, float32 in panels for the C++ kernel's own small-batch product (`panels`), where that
  measures faster than addmm (it streams W at memory speed, where MKL's gemv may not). bfloat16 keeps
  W as it is for the kernel's bfloat16 loop. Measured gains: docs/notes/code-measurements.md.

int8 (`INT8`, precision=int8; CPU only): `quantize` rounds W to 8 bits with one scale per output
column (symmetric, max |w| / 127) and prepacks it with the bias for fbgemm (torch's x86 quantized
engine); `dense` then runs torch.ops.quantized.linear_dynamic, which quantizes x per call (one
scale and zero point for the whole (rows, d_in) input, 8 bits, 7 on CPUs without VNNI so that
AVX2's 16-bit pair sums cannot saturate) and returns float32. Everything around the products
(the residual stream, LayerNorm, the attention's sums, the head) stays float32. At one row it is
slower than float32, at many faster (timings: docs/notes/code-measurements.md). `int8_weights(module)` runs a
module's forward (evaluation, the recompute sampler) through the same int8 products.
"""
import contextlib
import functools
import warnings

import torch
from torch import nn

from .. import probe

PACK_MIN_ROWS = 5     # fewer rows: the C++ step's own loops (decode_linear), which stream W
INT8 = torch.qint8    # the "dtype" of int8 products (precision=int8): `Dense.cast`, `quantize`, `dense`


def activation_dtype(dtype):
    """The dtype activations and states are kept in for products in `dtype`: float32 for int8
    (its products take and return float32), else dtype itself."""
    return torch.float32 if dtype == INT8 else dtype


class Dense(nn.Module):
    def __init__(self, d_in, d_out, std=0.02):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_in, d_out) * std)
        self.bias = nn.Parameter(torch.zeros(d_out))

    int8 = None           # (packed, None) from cast(INT8) while `int8_weights` runs the forward in int8

    def forward(self, x):                                  # (..., d_in) -> (..., d_out)
        if self.int8 is not None:
            return dense(x, self.int8)
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return out.view(*x.shape[:-1], out.shape[-1])

    def cast(self, dtype, batch=0):
        """(weight, bias) for products in `dtype` at `batch` rows: detached copies converted once
        (decoding states carry them), the weight prepacked by `pack` where it can be; the
        parameters themselves when they already are of dtype and the weight is not packed.
        dtype INT8: (fbgemm's packed int8 weight and bias, None), see `quantize`."""
        if dtype == INT8:
            return quantize(self.weight.detach(), self.bias.detach()), None
        w = pack(self.weight.detach().to(dtype), batch)
        if self.weight.dtype == dtype and not is_packed(w):
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


def is_packed(w):
    """Whether w is laid out by `pack` (oneDNN's prepacked tensor or float32 panels), not (d_in, d_out)."""
    return w.is_mkldnn or w.dim() == 3


@functools.cache
def panel_width():
    """The columns per panel of the C++ kernel's small-batch float32 product (64 with AVX-512,
    16 otherwise), or None where the kernel is unavailable."""
    from ..ops.kernel import kernel_error, load_kernel
    return load_kernel("cpu").decode_panel_width() if kernel_error("cpu") is None else None


def panels(w):
    """w (d_in, d_out) float32 -> (d_out / P, d_in, P): its columns in panels of P = `panel_width()`,
    each panel's rows contiguous, the layout the C++ kernel's small-batch float32 product streams
    (decode_linear). d_out must be a multiple of P."""
    P = panel_width()
    return w.view(w.shape[0], -1, P).permute(1, 0, 2).contiguous()


def faster_than_addmm(name, batch, d_in, d_out, candidate):
    """Whether the probe `name` (`imagegen.probe`, cached per machine) measures the product that
    candidate(w) returns, called as product(x, b), faster than torch's addmm by its margin, for a
    float32 (d_in, d_out) product at `batch` rows; never with probes off."""
    def measure():
        g = torch.Generator().manual_seed(0)
        x, w, b = torch.randn(batch, d_in, generator=g), torch.randn(d_in, d_out, generator=g), torch.zeros(d_out)
        product = candidate(w)
        with torch.no_grad():
            return probe.best_ms(lambda: torch.addmm(b, x, w), lambda: product(x, b), rounds=7)
    verdict = probe.decide(f"{name}:N{batch}:I{d_in}:O{d_out}", measure)
    return verdict is not None and verdict.chosen


def takes_panels(batch, d_in, d_out):
    """Whether a float32 (d_in, d_out) product at `batch` rows (below PACK_MIN_ROWS) runs on
    `panels`: where the kernel is built, d_out is a multiple of its panel width and a probe measures
    its product faster than addmm by the margin; never with probes off."""
    if not probe.enabled():
        return False
    P = panel_width()
    if P is None or d_out % P:
        return False

    def panel_product(w):          # as the C++ step calls it (a Python wrapper's microseconds
        from ..ops.kernel import load_kernel            # would decide a product this small)
        laid_out, product = panels(w), load_kernel("cpu").decode_linear
        return lambda x, b: product(x, laid_out, b)
    return faster_than_addmm("f32-panels", batch, d_in, d_out, panel_product)


def packs_float32(batch, d_in, d_out):
    """Whether a float32 (d_in, d_out) product at `batch` rows is prepacked: where a probe measures
    oneDNN's prepacked product faster than addmm by its margin; never with probes off."""
    def packed_product(w):
        packed = prepacked(w, batch)
        return lambda x, b: dense(x, (packed, b))
    return faster_than_addmm("f32-pack", batch, d_in, d_out, packed_product)


def pack(w, batch):
    """w (d_in, d_out) on the CPU -> the same product laid out for `batch` rows, which `dense` and the
    C++ decoding step apply: below PACK_MIN_ROWS rows float32 `panels` where `takes_panels`; from it,
    prepacked by oneDNN (an opaque (d_out, d_in) tensor, applied with
    torch.ops.mkldnn._linear_pointwise): bfloat16 where oneDNN can, float32 where `packs_float32`;
    w itself otherwise (other dtypes and devices)."""
    if w.device.type != "cpu":
        return w
    if batch < PACK_MIN_ROWS:
        return panels(w) if batch >= 1 and w.dtype == torch.float32 and takes_panels(batch, *w.shape) else w
    if not can_pack(w.dtype):
        return w
    if w.dtype == torch.float32 and not packs_float32(batch, *w.shape):
        return w
    return prepacked(w, batch)


@contextlib.contextmanager
def quiet_quantized():
    """torch's deprecation warnings about its quantized tensors silenced, only around the calls that
    make int8 weights (`quantize`; torch 2.13 warns that quantized tensors will leave torch); running
    them warns of nothing, and a warnings context per product would cost 7 us of each call."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantiz.*", category=UserWarning)
        warnings.filterwarnings("ignore", message=".*quantiz.*", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantiz.*", category=FutureWarning)
        yield


@functools.cache
def int8_reduce_range():
    """Whether int8 products quantize activations to 7 bits: on x86 CPUs without VNNI, where fbgemm
    sums pairs of u8 x s8 products in 16 bits (vpmaddubsw), which 8-bit inputs could saturate."""
    check = getattr(torch.cpu, "_is_vnni_supported", None)
    try:
        if check is not None:
            return not bool(check())
    except Exception:                                       # noqa: BLE001  (unknown: the safe choice)
        return True
    from ..precision import _cpuinfo_flags
    flags = _cpuinfo_flags()
    return not ({"avx512_vnni", "avx_vnni"} & flags)


def can_int8():
    """None where torch runs int8 dynamic quantized linears here (an x86 quantized engine), else why not."""
    engines = torch.backends.quantized.supported_engines
    if not ({"x86", "fbgemm"} & set(engines)):
        return f"torch here has no x86/fbgemm quantized engine (it has {', '.join(engines) or 'none'})"
    return None


def quantize(w, b):
    """w (d_in, d_out), b (d_out,) float -> fbgemm's packed int8 weight with the float32 bias, for
    `dense`: each output column rounded to 8 bits with its own scale max|w| / 127 (zero point 0)."""
    if torch.backends.quantized.engine not in ("x86", "fbgemm"):
        torch.backends.quantized.engine = "x86" if "x86" in torch.backends.quantized.supported_engines else "fbgemm"
    wt = w.detach().float().t().contiguous()                                 # (d_out, d_in)
    scales = (wt.abs().amax(1) / 127).clamp_min(1e-12).double()
    with quiet_quantized():
        qw = torch.quantize_per_channel(wt, scales, torch.zeros(len(scales), dtype=torch.long), 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(qw, b.detach().float().contiguous())


def is_int8(w):
    """Whether w (a `Dense.cast` weight) is `quantize`'s packed int8 weight."""
    return not isinstance(w, torch.Tensor)


def dense(x, weights):
    """x (..., d_in) through (weight, bias) from `Dense.cast`; x is converted to their dtype and
    the result (..., d_out) is of it (bfloat16 products accumulate in float32). int8 weights
    (`quantize`): x is taken as float32 and quantized for this call; the result is float32."""
    w, b = weights
    if is_int8(w):
        x2 = x.reshape(-1, x.shape[-1]).float().contiguous()       # (running it warns of nothing in torch 2.13)
        out = torch.ops.quantized.linear_dynamic(x2, w, int8_reduce_range())
        return out.view(*x.shape[:-1], out.shape[-1])
    x2 = x.reshape(-1, x.shape[-1]).to(w.dtype)
    if w.is_mkldnn:                                        # prepacked by `pack`
        out = torch.ops.mkldnn._linear_pointwise(x2.contiguous(), w, b, "none", [], "")
    elif w.dim() == 3:                                     # panels (`pack`, below PACK_MIN_ROWS)
        from ..ops.kernel import load_kernel
        out = load_kernel("cpu").decode_linear(x2, w, b)
    else:
        out = torch.addmm(b, x2, w)
    return out.view(*x.shape[:-1], out.shape[-1])


@contextlib.contextmanager
def int8_weights(module):
    """Inside: every Dense of `module` runs its forward through int8 weights (`quantize`, made once
    here) as `dense` runs them, activations quantized per call; outside, float32 as before. Nested
    inside another, it leaves the layers the outer one quantized as they are."""
    layers = [m for m in module.modules() if isinstance(m, Dense) and m.int8 is None]
    try:
        for m in layers:
            m.int8 = m.cast(INT8)
        yield module
    finally:
        for m in layers:
            m.int8 = None
