"""Weight layouts for the CPU's decoding products, chosen per shape and batch by measurement.

A Dense weight W (d_in, d_out) may be laid out once for the batch it will serve (`pack`):
- from PACK_MIN_ROWS rows, prepacked into oneDNN's own layout: always for bfloat16 (oneDNN's
  bfloat16 matmul otherwise repacks W at every call), for float32 where a probe measures that faster
  than addmm at the product's shape and batch (MKL's float32 products run well below oneDNN's on some
  CPUs);
- below it, float32 in panels for the C++ kernel's own small-batch product (`panels`), where a probe
  measures that faster than addmm (it streams W at memory speed). bfloat16 keeps W as it is for the
  kernel's bfloat16 loop.
The probes are `imagegen.tuning.probe` verdicts, cached per machine; timings: docs/notes/code-measurements.md.
"""
import functools

import torch

from ..tuning import probe
from .build import kernel_error, load_kernel

PACK_MIN_ROWS = 5     # fewer rows: the C++ step's own loops (decode_linear), which stream W


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


def linear_prepacked(x, w, b):
    """b + x W for x (rows, d_in) and W prepacked by `prepacked` (oneDNN)."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, b, "none", [], "")


def is_packed(w):
    """Whether w is laid out by `pack` (oneDNN's prepacked tensor or float32 panels), not (d_in, d_out)."""
    return w.is_mkldnn or w.dim() == 3


@functools.cache
def panel_width():
    """The columns per panel of the C++ kernel's small-batch float32 product (64 with AVX-512,
    16 otherwise), or None where the kernel is unavailable."""
    return load_kernel("cpu").decode_panel_width() if kernel_error("cpu") is None else None


def panels(w):
    """w (d_in, d_out) float32 -> (d_out / P, d_in, P): its columns in panels of P = `panel_width()`,
    each panel's rows contiguous, the layout the C++ kernel's small-batch float32 product streams
    (decode_linear). d_out must be a multiple of P."""
    P = panel_width()
    return w.view(w.shape[0], -1, P).permute(1, 0, 2).contiguous()


def faster_than_addmm(name, batch, d_in, d_out, candidate):
    """Whether the probe `name` (`imagegen.tuning.probe`, cached per machine) measures the product that
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

    def panel_product(w):          # as the C++ step calls it (a Python wrapper's microseconds would decide
        laid_out, product = panels(w), load_kernel("cpu").decode_linear
        return lambda x, b: product(x, laid_out, b)
    return faster_than_addmm("f32-panels", batch, d_in, d_out, panel_product)


def packs_float32(batch, d_in, d_out):
    """Whether a float32 (d_in, d_out) product at `batch` rows is prepacked: where a probe measures
    oneDNN's prepacked product faster than addmm by its margin; never with probes off."""
    def packed_product(w):
        packed = prepacked(w, batch)
        return lambda x, b: linear_prepacked(x, packed, b)
    return faster_than_addmm("f32-pack", batch, d_in, d_out, packed_product)


KEPT_SHAPE = (64, 256, 1024)   # rows, d_in, d_out of `bf16_faster`'s probe: a decoding step's feed-forward input


@functools.cache
def bf16_faster():
    """Whether this CPU runs bfloat16 products faster than float32's: where oneDNN runs bfloat16 with prepacked
    weights and a probe measures that (x converted to bfloat16 included) faster than addmm in float32 by its
    margin at KEPT_SHAPE; never with probes off. The rule for the products int8 keeps in bfloat16
    (`dense.kept_dtype`): one verdict per machine, whatever the batch, so that evaluation's forward and every
    batch's decoding run those products alike."""
    if not can_pack(torch.bfloat16):
        return False
    rows = KEPT_SHAPE[0]

    def bf16_product(w):
        packed = prepacked(w.bfloat16(), rows)
        return lambda x, b: linear_prepacked(x.bfloat16(), packed, b.bfloat16())
    return faster_than_addmm("bf16-pack", *KEPT_SHAPE, bf16_product)


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
