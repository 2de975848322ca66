"""int8 products (precision=int8; CPU only), through torch's fbgemm dynamic quantization.

`quantize` rounds W to 8 bits with one scale per output column (symmetric, max |w| / 127) and
prepacks it with the bias for fbgemm (torch's x86 quantized engine); `linear_int8` then runs
torch.ops.quantized.linear_dynamic, which quantizes x per call (one scale and zero point for the whole
(rows, d_in) input, 8 bits, 7 on CPUs without VNNI so that AVX2's 16-bit pair sums cannot saturate)
and returns float32. Everything around the products (the residual stream, LayerNorm, the attention's
sums, the head) stays float32. At one row it is slower than float32, at many faster (timings:
docs/notes/code-measurements.md).

The C++ kernel has its own int8 product (csrc/int8_linear.cpp, `decode_linear_int8`), for any number
of rows (4 at a time over each panel): `pack_int8` lays W out for it (8 bits per weight, one scale per
output column as `quantize`, in panels of 64 columns by groups of 4 k), the kernel quantizes each row
of x with its own scale and sums in int32 (AVX512-VNNI or AVX2 where the CPU has it: `int8_form`; a lesser
form inside `forced_form`, as a lesser CPU runs it);
`linear_int8_reference` computes the same in plain PyTorch. Each row's result depends on that row alone, so evaluation's
forward (rows = images x positions) and decoding's step (rows = images) compute the same numbers.
Decoding and `dense.int8_weights` take it (`Dense.cast`) in `step_form`, which the one-call C++ step
reads too, where `takes_kernel` says so: decoding where `sampling.plan.int8_one_call` measures the
one-call step faster than the module loop with fbgemm's products at the batch (with probes off: where the
kernel's product has a vector form, AVX512-VNNI or AVX2). Whole forward passes in int8
(`dense.int8_weights`: evaluation's precision=int8, the conversion's int8 check) take the kernel's product
wherever it builds, unmeasured: fbgemm's one scale per call would make their bits/dim depend on the batch.
"""
import contextlib
import functools
import warnings
from dataclasses import dataclass

import torch

from ..errors import UserError
from ..tuning.machine import has_vnni
from .build import kernel_error, load_kernel


@contextlib.contextmanager
def quiet_quantized():
    """torch's deprecation warnings about its quantized tensors silenced, only around the calls that
    make int8 weights (`quantize`; torch 2.13 warns that quantized tensors will leave torch); running
    them warns of nothing, and a warnings context per product would cost time at every call
    (docs/notes/code-measurements.md)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantiz.*", category=UserWarning)
        warnings.filterwarnings("ignore", message=".*quantiz.*", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantiz.*", category=FutureWarning)
        yield


@functools.cache
def int8_reduce_range():
    """Whether int8 products quantize activations to 7 bits: on x86 CPUs without VNNI, where fbgemm
    sums pairs of u8 x s8 products in 16 bits (vpmaddubsw), which 8-bit inputs could saturate."""
    return not has_vnni()


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


def linear_int8(x, w):
    """x (rows, d_in) float -> (rows, d_out) float32 through `quantize`'s packed weight (and its bias)."""
    return torch.ops.quantized.linear_dynamic(x.float().contiguous(), w, int8_reduce_range())


INT8_PANEL = 64   # output columns per panel of `pack_int8`'s layout
INT8_GROUP = 4    # consecutive k per 32-bit lane (AVX512-VNNI's vpdpbusd sums 4 byte products)


def pack_int8(w):
    """w (d_in, d_out) float -> (Wq, scales, colsums) for the C++ kernel's `decode_linear_int8`:
    q = round(w / scale) in [-127, 127] with scale = max|w| / 127 per output column (float32, as
    `quantize`'s); Wq int8 (ceil(d_out / 64), ceil(d_in / 4), 64, 4): panels of 64 columns, in each
    the groups of 4 consecutive k with each column's 4 weights together, zero-padded; scales (d_out,)
    float32; colsums (d_out,) int32, the sum of each column's q."""
    w = w.detach().float()
    K, O = w.shape
    scales = (w.abs().amax(0) / 127).clamp_min(1e-12)
    q = torch.round(w / scales).clamp(-127, 127).to(torch.int8)
    return lay_out_int8(q), scales.contiguous(), q.sum(0, dtype=torch.int32)


def lay_out_int8(q):
    """q (d_in, d_out) int8 -> `pack_int8`'s Wq (ceil(d_out / 64), ceil(d_in / 4), 64, 4), zero-padded."""
    K, O = q.shape
    Kp = -(-K // INT8_GROUP) * INT8_GROUP
    Op = -(-O // INT8_PANEL) * INT8_PANEL
    padded = torch.zeros(Kp, Op, dtype=torch.int8)
    padded[:K, :O] = q
    return padded.view(Kp // INT8_GROUP, INT8_GROUP, Op // INT8_PANEL, INT8_PANEL).permute(2, 0, 3, 1).contiguous()


def unpack_int8(packed, d_in):
    """The int8 weights q (d_in, d_out) of `pack_int8`'s (Wq, scales, colsums)."""
    Wq, scales, _ = packed
    P, G, C, T = Wq.shape
    return Wq.permute(1, 3, 0, 2).reshape(G * T, P * C)[:d_in, :len(scales)]


def quantize_rows(x):
    """x (N, K) -> (xs int32 in [-127, 127], sx float32 (N,)): each row rounded to 8 bits with its own
    scale, as `decode_linear_int8` does: sx = max|x| / 127, xs = round(x * (127 / max|x|)), ties to
    even, every product rounded to float32 first (0 for a row of zeros)."""
    x = x.float()
    amax = x.abs().amax(1)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    xs = torch.round(x * inv[:, None]).clamp(-127, 127).to(torch.int32)
    return xs, amax / 127


def linear_int8_reference(x, packed, b):
    """What `decode_linear_int8(x, *packed, b)` computes, in plain PyTorch: x quantized per row
    (`quantize_rows`), acc = xs q summed exactly (float64 holds every such sum), then in float32
    out = float32(acc) * (sx * scale) + b. The kernel may fuse the last multiply-add (one rounding
    fewer): its outputs are within float32 rounding of these."""
    xs, sx = quantize_rows(x)
    q = unpack_int8(packed, x.shape[1])
    acc = (xs.double() @ q.double()).to(torch.int32)
    return acc.float() * (sx[:, None] * packed[1][None, :]) + b.float()


def step_form(w, b):
    """w (d_in, d_out), b (d_out,) -> (Wq, extra): `pack_int8`'s Wq and one float32 (3, d_out) tensor of the
    bias, the scales and the column sums (their int32 bits, copied as they are), the form `dense` and the
    one-call C++ step (decode_step) pass to the kernel's decode_linear."""
    Wq, scales, colsums = pack_int8(w)
    return Wq, torch.stack([b.detach().float(), scales, colsums.view(torch.float32)])


@dataclass
class Forced:
    """What `forced_product` and `forced_form` force now."""
    kind: str | None = None    # "kernel" or "fbgemm" inside `forced_product`
    form: str = "auto"         # the kernel's int8 form inside `forced_form`; auto: the best this CPU runs


_forced = Forced()


@contextlib.contextmanager
def _forcing(name, value):
    """Inside: the setting `_forced.<name>` is value; after, what it was."""
    before = getattr(_forced, name)
    setattr(_forced, name, value)
    try:
        yield
    finally:
        setattr(_forced, name, before)


@contextlib.contextmanager
def forced_product(kind):
    """Inside: decoding's int8 products are `kind`'s ("kernel": the C++ kernel's, so the one-call step;
    "fbgemm": fbgemm's, so the module loop), whatever `takes_kernel` and decoding's probe would pick."""
    if kind not in ("kernel", "fbgemm"):
        raise ValueError(f"forced_product takes 'kernel' or 'fbgemm', not {kind!r}")
    with _forcing("kind", kind):
        yield


def forced():
    """What `forced_product` forces now ("kernel", "fbgemm"), or None."""
    return _forced.kind


def takes_kernel(always=False):
    """Whether int8 products run on the C++ kernel's int8 product rather than fbgemm's: where the kernel
    builds and, inside `forced_product`, where it forces "kernel"; outside it, where the kernel's product has
    a vector form (`int8_form`: vnni or avx2). Decoding forces the choice `sampling.plan.int8_one_call`
    measures on whole steps. always=True: wherever the kernel builds (per-row results, which depend neither
    on how many rows a call holds nor on the thread count)."""
    if kernel_error("cpu") is not None:
        return False
    if always:
        return True
    if _forced.kind is not None:
        return _forced.kind == "kernel"
    return int8_form() in ("vnni", "avx2")


@contextlib.contextmanager
def forced_form(form):
    """Inside: the kernel's int8 products (decoding's, the one-call step's, `dense.int8_weights`' forward) run in
    `form` ("vnni", "avx2", "portable"; "auto": the best this CPU runs), e.g. avx2 on an AVX-512 CPU to measure
    what an AVX2-only CPU runs (tools/int8_step.py --form); a form this CPU cannot run is one sentence."""
    forms = load_kernel("cpu").decode_int8_forms() if kernel_error("cpu") is None else []
    if form != "auto" and form not in forms:
        raise UserError(f"int8 form {form!r} is not one this CPU runs; use auto or one of {', '.join(forms) or 'none'} "
                        f"(the C++ kernel's: python -m imagegen.ops builds it).")
    with _forcing("form", form):
        yield


def asked_form():
    """The int8 form `forced_form` asks for now ("auto" outside it), which `dense` and `decode.decode_step` pass
    to the kernel."""
    return _forced.form


def int8_form():
    """The form of the kernel's int8 product that runs here now (`kernel.decode_int8_form`): the best this CPU
    runs ("vnni": AVX512-VNNI, "avx2", else "portable"), or inside `forced_form` the one it forces; None where
    the kernel is not built."""
    if kernel_error("cpu") is not None:
        return None
    return load_kernel("cpu").decode_int8_form(_forced.form)


def quantize_columns(w):
    """w (d_in, d_out) float -> (q int8 (d_in, d_out), scales float32 (d_out,)): `pack_int8`'s rounding
    (q = round(w / scale) in [-127, 127], scale = max|w| / 127 per output column), unpacked: the int8
    weights of the shipped form (imagegen.store.shipped.int8_state), which load as q * scale."""
    packed = pack_int8(w)
    return unpack_int8(packed, w.shape[0]).contiguous(), packed[1]
