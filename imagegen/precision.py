"""The precision products run in: bfloat16 where it measures faster (training autocast, sampling and
evaluation), int8 for sampling and evaluation where asked.

Training (train.bf16): matrix products run in bfloat16 (float32 accumulation); parameters,
optimizer state, the linear attention's sums (`imagegen.ops.linear_attention`) and the loss stay
float32. Sampling and evaluation (precision=float32|bfloat16|auto|int8): see `decide_precision`.
int8 (sampling and evaluation on the CPU): the Dense products with 8-bit weights (but those the model
keeps out of int8, `ops.dense.int8_keeps`), see `imagegen.ops.int8`. Sampling's `auto` takes int8
only for a model whose int8 cost in bits/dim was recorded (`int8_cost`: imagegen-convert scores its check
images both ways) and is at most INT8_MAX_COST, and only where its decoding products measure faster than
float32's (`auto_int8`); evaluation's `auto` never takes it (its figure should be the model's own).

A flag does not say how fast a product runs (an AVX512-BF16 Xeon multiplies bfloat16 slower than
float32; without AVX512-BF16 or AMX bfloat16 products are emulated, many times slower). So on the
CPU `auto` decides by measurement where the caller names the shapes (`auto_bf16`): the products the
path really runs, timed once per machine in float32 and in bfloat16 through `imagegen.tuning.probe`
(training: autocast Dense products forward and backward; evaluation: forward; sampling: the decoding
step's products at the batch in use, prepacked or through the C++ step's own loop, as the sampler
runs them), bfloat16 only when it is `probe.MARGIN` times faster. IMAGEGEN_PROBE=0 falls back to the
capability rule (`tuning.machine.fast_bf16`); CUDA keeps that rule. Timings on CPUs with and without
bfloat16 hardware: docs/notes/code-measurements.md.
"""
import torch

from .dtypes import INT8, autocast, dtype_name
from .errors import UserError
from .ops.build import kernel_error, load_kernel
from .ops.dense import Dense, dense, int8_keeps
from .ops.int8 import can_int8, int8_form
from .ops.layout import PACK_MIN_ROWS, pack
from .tuning import probe
from .tuning.choice import Choice
from .tuning.machine import fast_bf16

PRECISIONS = ("float32", "bfloat16", "auto", "int8")
FLOAT_PRECISIONS = PRECISIONS[:3]      # training's: int8 is for sampling and evaluation only


INT8_MAX_COST = 0.01   # bits/dim: sampling's auto takes int8 only for a model whose recorded cost is at most this
PROBE_ROWS = 128       # rows of the training probe's products (the ratio, not the size, is what counts)


def train_products(d_model, d_ff, backward=True):
    """A probe's measure() for training (backward) or evaluation: Dense products x W1 -> W2 (D -> F -> D)
    on PROBE_ROWS rows, forward (and backward), in float32 and under bfloat16 autocast."""
    def measure():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(PROBE_ROWS, d_model, generator=g).requires_grad_(backward)
        w1 = (torch.randn(d_model, d_ff, generator=g) * 0.02).requires_grad_(backward)
        w2 = (torch.randn(d_ff, d_model, generator=g) * 0.02).requires_grad_(backward)
        b1, b2 = torch.zeros(d_ff), torch.zeros(d_model)

        def run(bf16):
            with torch.set_grad_enabled(backward), autocast(torch.device("cpu"), bf16):
                y = torch.addmm(b2, torch.addmm(b1, x, w1), w2)
            if backward:
                torch.autograd.grad(y.float().sum(), (x, w1, w2))
        return probe.best_ms(lambda: run(False), lambda: run(True))
    return measure


def decode_products(batch, d_model, d_ff):
    """A probe's measure() for sampling: one decoding step's products at `batch` rows (D -> 3D, D -> D,
    D -> F, F -> D) as the sampler runs them: float32 (addmm, prepacked or in panels where `layout.pack`
    finds that faster), against bfloat16 weights prepacked for the batch (`layout.pack`) or, below
    PACK_MIN_ROWS rows, the C++ step's own loop; below PACK_MIN_ROWS, where the C++ step is built,
    both through its decode_linear, as the step calls them."""
    def measure():
        g = torch.Generator().manual_seed(0)
        shapes = [(d_model, 3 * d_model), (d_model, d_model), (d_model, d_ff), (d_ff, d_model)]
        plain = [((torch.randn(i, o, generator=g) * 0.02), torch.zeros(o)) for i, o in shapes]
        f32 = [(pack(w, batch), b) for w, b in plain]
        bf16 = [(pack(w.to(torch.bfloat16), batch), b.to(torch.bfloat16)) for w, b in plain]
        xs = [torch.randn(batch, i, generator=g) for i, _ in shapes]
        own_loop = batch < PACK_MIN_ROWS and kernel_error("cpu") is None
        product = load_kernel("cpu").decode_linear if own_loop else (lambda x, w, b: dense(x, (w, b)))

        def run(weights, fn):
            with torch.no_grad():
                for x, (w, b) in zip(xs, weights):
                    fn(x, w, b)
        return probe.best_ms(lambda: run(f32, product), lambda: run(bf16, product), rounds=7)
    return measure


def int8_products(batch, d_model, d_ff):
    """A probe's measure() for sampling at int8: one decoding step's products at `batch` rows (the shapes
    of `decode_products`), float32 against int8 weights, each as `Dense.cast` makes them for the batch and
    `dense` runs them (float32 prepacked or in panels; int8 the C++ kernel's product in its best form here,
    VNNI or AVX2, else fbgemm's: `ops.int8.takes_kernel`)."""
    def measure():
        torch.manual_seed(0)
        layers = [Dense(i, o) for i, o in [(d_model, 3 * d_model), (d_model, d_model), (d_model, d_ff),
                                           (d_ff, d_model)]]
        xs = [torch.randn(batch, layer.weight.shape[0]) for layer in layers]
        f32, int8 = ([layer.cast(dtype, batch) for layer in layers] for dtype in (torch.float32, INT8))

        def run(weights):
            with torch.no_grad():
                for x, w in zip(xs, weights):
                    dense(x, w)
        return probe.best_ms(lambda: run(f32), lambda: run(int8), rounds=7)
    return measure


def keep_out_of_int8(model):
    """Mark the products a PixelTransformer keeps out of int8 (`ops.dense.int8_keeps`): its head in float32 and
    its first block's feed-forward input in bfloat16 (float32 where this CPU's bfloat16 is not faster), where
    8-bit activations cost the most bits/dim (docs/speed.md). One rule for decoding and whole forward passes:
    every loaded model (`store.checkpoint.model_from_checkpoint`) and every int8 run (`sampling.plan.
    decoding_state`, `sampling.decode.int8_forward`) applies it, so evaluation scores what sampling computes.
    Returns model."""
    int8_keeps([model.proj], torch.float32)
    int8_keeps([model.blocks[0].ff[0]], torch.bfloat16)
    return model


def int8_cost(record):
    """The bits/dim int8 products cost a shipped model, as imagegen-convert recorded them (record's
    int8_check: int8's minus float32's over the same test images), or None where none is recorded."""
    check = (record or {}).get("int8_check") or {}
    try:
        return float(check["int8"]) - float(check["float32"])
    except (KeyError, TypeError, ValueError):
        return None


def auto_int8(device, dims, batch, cost):
    """(int8?, why) for sampling's `auto`: on the CPU, for a model whose recorded int8 cost (`int8_cost`)
    is at most INT8_MAX_COST, where int8 works here and its decoding products at `batch` rows measure
    `probe.MARGIN` times float32's speed (with probes off: never)."""
    if device.type != "cpu" or dims is None or batch is None:
        return False, "int8 is measured on the CPU only"
    if cost is None:
        return False, "no int8 cost recorded for this model (imagegen-convert records it)"
    if cost > INT8_MAX_COST:
        return False, f"int8 costs this model {cost:.4f} bits/dim, above the {INT8_MAX_COST} allowed"
    if (why := can_int8()) is not None:
        return False, why
    D, F = (int(d) for d in dims)
    form = int8_form() or "fbgemm"         # the kernel's int8 form (or fbgemm's only): part of what is timed
    verdict = probe.decide(f"int8-decode:{form}:N{int(batch)}:D{D}:F{F}", int8_products(int(batch), D, F))
    if verdict is None:
        return False, "int8 not measured (probes off)"
    return verdict.chosen, (f"int8 products measured {verdict.ratio:.2f}x float32's speed here, "
                            f"{'at least' if verdict.chosen else 'below'} the {probe.MARGIN:.2f}x asked, "
                            f"at a recorded cost of {cost:+.4f} bits/dim ({verdict.where()})")


def auto_bf16(device, dims=None, batch=None, backward=True):
    """(bfloat16?, why) for an `auto` setting on `device`. On the CPU with dims = (d_model, d_ff) named
    and probes on, by measurement (`imagegen.tuning.probe`): sampling's decoding products when `batch` is
    given, else training's (backward) or evaluation's autocast products; otherwise the flags rule."""
    if device.type == "cpu" and dims is not None:
        D, F = (int(d) for d in dims)
        if batch is not None:
            verdict = probe.decide(f"bf16-decode:N{int(batch)}:D{D}:F{F}", decode_products(int(batch), D, F))
        else:
            verdict = probe.decide(f"bf16-{'train' if backward else 'eval'}:D{D}:F{F}",
                                   train_products(D, F, backward))
        if verdict is not None:
            return verdict.chosen, (f"bfloat16 products measured {verdict.ratio:.2f}x float32's speed here, "
                                    f"{'at least' if verdict.chosen else 'below'} the {probe.MARGIN:.2f}x asked "
                                    f"({verdict.where()})")
    fast, why = fast_bf16(device)
    return fast, why


def decide_bf16(setting, device, key="train.bf16", dims=None):
    """The bf16 setting (auto, true or false) resolved for `device` -> Choice(bfloat16?, the training header's
    words on the precision and why); dims (d_model, d_ff): see `auto_bf16`."""
    if setting == "auto":
        fast, why = auto_bf16(device, dims)
        return Choice(fast, f"{'bfloat16 autocast' if fast else 'float32'} (train.bf16=auto: {why})")
    if not isinstance(setting, bool):
        raise UserError(f"{key} must be auto, true or false, not {setting!r}.")
    fast, why = fast_bf16(device)
    slow = f"; slow here: {why}, so bfloat16 products are emulated" if setting and not fast else ""
    return Choice(setting, f"{'bfloat16 autocast' if setting else 'float32'} (train.bf16={str(setting).lower()}{slow})")


def slow_bf16_note(dtype, device):
    """One line when `dtype` is bfloat16 on a device where bfloat16 products are slow, else None."""
    fast, why = fast_bf16(device)
    if dtype != torch.bfloat16 or fast:
        return None
    return f"note: bfloat16 is slow here ({why}): its products are emulated, many times slower than float32."


def why_not_int8(device, key="precision"):
    """None where {key}=int8 runs on device (the CPU, with torch's fbgemm int8 products), else the sentence
    saying why not and what to use instead (what `decide_precision` raises for it)."""
    if device.type != "cpu":
        return (f"{key}=int8 runs on the CPU only (torch's fbgemm int8 products); use device=cpu, or float32 or "
                f"bfloat16 on {device.type}.")
    if (why := can_int8()) is not None:
        return f"{key}=int8 is not available: {why}; use float32."
    return None


def decide_precision(setting, device, key="precision", dims=None, batch=None, choices=PRECISIONS, record=None):
    """precision=float32|bfloat16|auto|int8 -> Choice(torch.float32, torch.bfloat16 or dtypes.INT8 (torch.qint8:
    int8 Dense products, CPU only), why auto chose it ("" for the other settings)); auto: int8 for sampling
    (batch given) where `auto_int8` says so for the model's record (a shipped model's; None: never), else
    bfloat16 where faster; dims (d_model, d_ff) and batch: the sampler's products to measure, see `auto_bf16`.
    choices: the settings allowed."""
    if setting not in choices:
        raise UserError(f"{key} must be one of {', '.join(choices)}, not {setting!r}.")
    if setting == "int8":
        if (why := why_not_int8(device, key)) is not None:
            raise UserError(why)
        return Choice(INT8)
    if setting != "auto":
        return Choice(torch.bfloat16 if setting == "bfloat16" else torch.float32)
    int8, why = auto_int8(device, dims, batch, int8_cost(record)) if batch is not None else (False, None)
    if int8:
        return Choice(INT8, why)
    bf16, bf16_why = auto_bf16(device, dims, batch, backward=False)
    return Choice(torch.bfloat16 if bf16 else torch.float32, "; ".join(filter(None, [bf16_why, why])))


def resolve_precisions(settings, device, key, choices=PRECISIONS):
    """A benchmark's list of precisions (each one of choices: float32|bfloat16|auto, and int8 for
    sampling) -> (the distinct dtype names to measure, in order; a line saying why bfloat16 is left
    out or slow here, or None). `auto` adds bfloat16 only where it is fast, so the defaults do not
    spend an hour on emulated products; it never adds int8."""
    names = list(dict.fromkeys(dtype_name(decide_precision(s, device, key, choices=choices).value) for s in settings))
    if "bfloat16" in names:
        return names, slow_bf16_note(torch.bfloat16, device)
    if "auto" in settings:
        return names, f"bfloat16 not measured: {fast_bf16(device)[1]} ({key}=[float32,bfloat16] measures it anyway)."
    return names, None
