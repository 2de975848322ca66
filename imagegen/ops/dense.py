"""Dense: a linear layer that stores its weight as (in, out), and `dense`, its products in any dtype.

x @ W with W (in, out) contiguous is a row-combination that runs markedly faster than
nn.Linear's x @ W^T for the small batches of step-by-step sampling (see docs/design.md), and no
slower for training. One addmm for any number of leading dims keeps the bias add inside the product,
which under bfloat16 autocast also keeps the output bfloat16 (a separate float32 bias add would
promote it and cost a full pass over the activations).

Decoding may run its products in another dtype (bfloat16 or int8 sampling): `Dense.cast` converts the
weights once (laid out for the batch by `layout.pack`, or quantized by `int8.quantize`), the decoding
state carries them, and `dense` applies them. `int8_weights(module)` runs a module's forward
(evaluation, the recompute sampler) through the same int8 products.
"""
import contextlib

import torch
from torch import nn

from ..dtypes import INT8
from .build import load_kernel
from .int8 import asked_form, is_int8, linear_int8, quantize, step_form, takes_kernel
from .layout import bf16_faster, is_packed, linear_prepacked, pack


class Dense(nn.Module):
    def __init__(self, d_in, d_out, std=0.02):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_in, d_out) * std)
        self.bias = nn.Parameter(torch.zeros(d_out))

    int8 = None           # cast(INT8)'s weights while `int8_weights` runs the forward in int8
    int8_keeps = None     # the model's rule (`int8_keeps`): None, int8; float32 or bfloat16, cast(INT8) gives those

    def forward(self, x):                                  # (..., d_in) -> (..., d_out)
        if self.int8 is not None:
            return dense(x, self.int8)
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return out.view(*x.shape[:-1], out.shape[-1])

    def cast(self, dtype, batch=0, per_row=False):
        """(weight, bias) for products in `dtype` at `batch` rows: detached copies converted once
        (decoding states carry them), the weight prepacked by `pack` where it can be; the
        parameters themselves when they already are of dtype and the weight is not packed.
        dtype INT8: for a layer the model keeps out of int8 (`int8_keeps`), cast(its `kept_dtype`); else where
        `takes_kernel` (per_row: wherever the kernel builds), the C++ kernel's (Wq, extra)
        (`int8.step_form`, activations quantized per row), else
        (fbgemm's packed int8 weight and bias, None; one activation scale per call), see `int8.quantize`."""
        if dtype == INT8:
            if self.int8_keeps is not None:
                return self.cast(kept_dtype(self.int8_keeps), batch)
            if takes_kernel(always=per_row):
                return self.step_form()
            return quantize(self.weight.detach(), self.bias.detach()), None
        w = pack(self.weight.detach().to(dtype), batch)
        if self.weight.dtype == dtype and not is_packed(w):
            return self.weight, self.bias
        return w, self.bias.detach().to(dtype)

    def step_form(self):
        """The C++ kernel's int8 (Wq, extra) of the parameters (`int8.step_form`), quantized once per version of
        them: torch counts every in-place change of a tensor (an optimizer's step, load_state_dict, copy_), so a
        sampler's every call reuses them (quantizing costs: docs/notes/code-measurements.md) until the weights
        change. (A change made through `.data` escapes that count; nothing here makes one.)"""
        key = (self.weight._version, self.bias._version, self.weight.data_ptr(), self.bias.data_ptr())
        if self._step_form[0] != key:
            self._step_form = (key, step_form(self.weight.detach(), self.bias.detach()))
        return self._step_form[1]

    _step_form = (None, None)   # (the parameters' versions and addresses, their step form)

    def extra_repr(self):
        return f"{self.weight.shape[0]} -> {self.weight.shape[1]}"


def dense(x, weights):
    """x (..., d_in) through (weight, bias) from `Dense.cast`; x is converted to their dtype and
    the result (..., d_out) is of it (bfloat16 products accumulate in float32). int8 weights
    (`quantize`, or the kernel's `step_form`, in the form `int8.forced_form` asks for): x is taken as float32
    and quantized for this call, per call or per row; the result is float32."""
    w, b = weights
    if is_int8(w):
        out = linear_int8(x.reshape(-1, x.shape[-1]), w)        # (running it warns of nothing in torch 2.13)
        return out.view(*x.shape[:-1], out.shape[-1])
    if w.dtype == torch.int8:                              # the kernel's int8 product (`int8.step_form`)
        out = load_kernel("cpu").decode_linear(x.reshape(-1, x.shape[-1]).float(), w, b, asked_form())
        return out.view(*x.shape[:-1], out.shape[-1])
    x2 = x.reshape(-1, x.shape[-1]).to(w.dtype)
    if w.is_mkldnn:                                        # prepacked by `pack`
        out = linear_prepacked(x2, w, b)
    elif w.dim() == 3:                                     # panels (`pack`, below PACK_MIN_ROWS)
        out = load_kernel("cpu").decode_linear(x2, w, b)
    else:
        out = torch.addmm(b, x2, w)
    return out.view(*x.shape[:-1], out.shape[-1])


def int8_keeps(layers, dtype):
    """Mark the Dense `layers` whose products stay out of int8 when a model runs in int8 (`Dense.int8_keeps`),
    in dtype: torch.float32, or torch.bfloat16 (`kept_dtype`: where this CPU's bfloat16 products measure
    faster than float32's, else float32). One rule, which decoding (`Dense.cast`, the one-call C++ step
    included) and whole forward passes (`int8_weights`: evaluation, imagegen-convert's check) both read, so
    evaluation's precision=int8 scores what int8 sampling computes. `precision.keep_out_of_int8` names them
    for a PixelTransformer."""
    for layer in layers:
        layer.int8_keeps = dtype


def kept_dtype(dtype):
    """The dtype a layer int8 keeps in `dtype` runs in here: bfloat16 only where `bf16_faster`, else float32."""
    return torch.bfloat16 if dtype == torch.bfloat16 and bf16_faster() else torch.float32


def int8_product(module):
    """How the int8 weights that `int8_weights` put on module's Dense layers quantize activations:
    "per row" (the kernel's product), "per call" (fbgemm's), "mixed", or None outside `int8_weights`."""
    kinds = {"per call" if is_int8(m.int8[0]) else "per row"
             for m in module.modules() if isinstance(m, Dense) and m.int8 is not None and m.int8_keeps is None}
    return None if not kinds else kinds.pop() if len(kinds) == 1 else "mixed"


def forward_int8_product():
    """The int8 product `int8_weights` gives a forward here, decided before it runs (`int8_product` reads it
    back from the weights): "per row" (the kernel's) wherever the kernel builds, else "per call" (fbgemm's)."""
    return "per row" if takes_kernel(always=True) else "per call"


@contextlib.contextmanager
def int8_weights(module):
    """Inside: every Dense of `module` runs its forward through int8 weights (`Dense.cast`, made once
    here; float32 or bfloat16 for the layers it keeps, `int8_keeps`, as decoding's int8 keeps them) as `dense`
    runs them, activations quantized per row by the kernel's product wherever it builds
    (so a forward's bits/dim depends on nothing but the weights and the images), else per call by
    fbgemm's; outside, float32 as before. Nested
    inside another, it leaves the layers the outer one quantized as they are."""
    layers = [m for m in module.modules() if isinstance(m, Dense) and m.int8 is None]
    try:
        for m in layers:
            m.int8 = m.cast(INT8, per_row=True)
        yield module
    finally:
        for m in layers:
            m.int8 = None
