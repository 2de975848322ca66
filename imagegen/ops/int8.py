"""int8 products (precision=int8; CPU only), through torch's fbgemm dynamic quantization.

`quantize` rounds W to 8 bits with one scale per output column (symmetric, max |w| / 127) and
prepacks it with the bias for fbgemm (torch's x86 quantized engine); `linear_int8` then runs
torch.ops.quantized.linear_dynamic, which quantizes x per call (one scale and zero point for the whole
(rows, d_in) input, 8 bits, 7 on CPUs without VNNI so that AVX2's 16-bit pair sums cannot saturate)
and returns float32. Everything around the products (the residual stream, LayerNorm, the attention's
sums, the head) stays float32. At one row it is slower than float32, at many faster (timings:
docs/notes/code-measurements.md).
"""
import contextlib
import functools
import warnings

import torch

from ..tuning.machine import has_vnni


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
