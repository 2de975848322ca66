"""How a call runs on this machine, decided before it runs (Plan: the public API's sampling and scoring plans),
and how a model decodes here, chosen outside the model (which only holds its parameters, its
forward and its step): `decoding_state` makes the state `PixelTransformer.step` reads with these choices, and
`make_step` the sampler's step function, on CUDA a compiled CUDA graph that this plan keeps (GRAPHED).

Which int8 decoding step a linear PixelTransformer runs at a batch: the one-call C++ step (the kernel's
int8 products, activations quantized per row) or the Python module loop with fbgemm's products (one
activation scale per call). Measured on whole steps, not single products: the one-call step also saves
the loop's Python work, which a product-by-product timing does not see (figures:
docs/notes/code-measurements.md).
"""
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Optional

import torch

from ..dtypes import INT8
from ..ops.int8 import forced, forced_product, int8_form
from ..precision import keep_out_of_int8
from ..tuning import probe
from .cuda_graph_step import GraphedStep

STEPS = 3   # decoding steps per timed call


@dataclass(frozen=True)
class Plan:
    """How a call of Model runs here, decided before it runs (Model.sampling_plan, Model.scoring_plan).

    Attributes:
        dtype: the products': torch.float32, torch.bfloat16 or dtypes.INT8 (int8 Dense products, CPU).
        precision: its name: float32, bfloat16 or int8.
        reason: why precision=auto chose it ("" for the other settings).
        note: a line when that dtype is slow here (emulated bfloat16), else None.
        sampler: step (an RNN or a KV cache) or recompute; None for scoring.
        loop: what the sampler amounts to here: recurrent, kv-cache or recompute; None for scoring.
        batch: images drawn at a time (at most the images asked for); None for scoring.
        int8_product: scoring at int8: how its products quantize activations, "per row" (the C++ kernel's,
            wherever it builds: a figure independent of the batch) or "per call" (fbgemm's); else None
            (sampling at int8 picks its product as it decodes).
    """
    dtype: torch.dtype
    precision: str
    reason: str = ""
    note: Optional[str] = None
    sampler: Optional[str] = None
    loop: Optional[str] = None
    batch: Optional[int] = None
    int8_product: Optional[str] = None


def int8_one_call(model, batch):
    """Whether `model`'s int8 decoding at `batch` images takes the one-call C++ step: where the kernel builds
    and a probe (`imagegen.tuning.probe`, keyed by the kernel's int8 form, the batch and the model's shape)
    does not find the module loop with fbgemm's products `probe.MARGIN` times faster; with probes off, where
    the kernel's int8 product has a vector form (vnni, avx2; its portable loop is slow). Inside
    `ops.int8.forced_product`, what that forces."""
    if forced() is not None:
        return forced() == "kernel"
    form = int8_form()
    if form is None:
        return False
    D, F = model.blocks[0].ff[0].weight.shape
    name = (f"int8-step:{form}:N{int(batch)}:D{D}:F{F}:L{len(model.blocks)}:H{model.blocks[0].attn.n_heads}"
            f":C{len(model.context)}")
    verdict = probe.decide(name, lambda: time_steps(model, batch))
    if verdict is None:
        return form != "portable"
    return not verdict.chosen


def time_steps(model, batch):
    """(one-call step ms, module loop with fbgemm's products ms) for STEPS steps of `model` at `batch` images."""
    device, token = torch.device("cpu"), torch.zeros(batch, dtype=torch.long)
    states = []
    for kind in ("kernel", "fbgemm"):
        with forced_product(kind):
            states.append(model.init_state(batch, device, INT8))

    def run(state):
        with torch.inference_mode():
            for _ in range(STEPS):
                state.t = 1
                model.step(token, state)
    return probe.best_ms(lambda: run(states[0]), lambda: run(states[1]), rounds=5)


def decoding_state(model, batch, device, dtype=None, labels=None, whole_model_kernel=True):
    """`model.init_state(batch, device, dtype, whole_model_kernel, labels)` with this machine's choices: for
    int8 (dtypes.INT8) the products `int8_one_call` measures faster at this batch (the kernel's, and so the
    one-call C++ step, or fbgemm's in the module loop), the products `keep_out_of_int8` names kept out of it."""
    dtype = dtype or model.proj.weight.dtype
    if dtype == INT8:
        keep_out_of_int8(model)
    products = forced_product("kernel" if int8_one_call(model, batch) else "fbgemm") if dtype == INT8 \
        else nullcontext()
    with products:
        return model.init_state(batch, device, dtype, whole_model_kernel=whole_model_kernel, labels=labels)


def make_step(model, batch, device, dtype, labels=None):
    """step(token (N,) long) -> parameters (N, P) for the next position, from a fresh state;
    labels (N,) for a class-conditional model (None: no label)."""
    device = torch.device(device)
    if use_graphs(model, device):
        return GRAPHED.get(model, batch, device, dtype).reset(labels)
    state = decoding_state(model, batch, device, dtype, labels=labels)
    return lambda token: model.step(token, state)[0]


def use_graphs(model, device):
    """CUDA, and every attention linear (a constant-size state)."""
    return device.type == "cuda" and all(b.attn.name == "linear" for b in model.blocks)


class GraphedSteps:
    """The CUDA graphs compiled for one model, by (batch, device, dtype): compiling one takes seconds, so
    sampling the model again replays them. A different model replaces them: one model's graphs are held."""

    def __init__(self):
        self.model, self.steps = None, {}

    def get(self, model, batch, device, dtype):
        if model is not self.model:
            self.model, self.steps = model, {}
        key = (batch, str(device), dtype)
        if key not in self.steps:
            self.steps[key] = GraphedStep(model, batch, device, dtype)
        return self.steps[key]


GRAPHED = GraphedSteps()
