"""The model's causal linear attention through Triton kernels (`triton_kernels`): training
forward and backward as an autograd.Function, and the decoding step.

For CUDA tensors the kernels are compiled. When TRITON_INTERPRET=1 was set before triton was
imported, they run in Triton's interpreter, on CPU tensors too (numpy, slow: for tests, which
is how the arithmetic is checked without a GPU; the interpreter's bfloat16 arithmetic is
wrong, so CPU tensors take float32 and float16 only).
Inputs float32, float16 or bfloat16, summed in float32; head dims up to MAX_DIM; any length.
Triton is optional: this module imports it only inside functions, and `triton_error` says
why it cannot be used (not installed, no GPU, a kernel that does not compile or computes
wrong on this device), so that callers fall back loudly.

Shape letters: N batch, H heads, L length, E query/key dim, M value dim.
"""

import torch
from torch.autograd.function import once_differentiable

from .build import warn_fallback
from .causal_linear import EPS, causal_product_chunked, normalise, phi, with_ones
from .kernel import empty_heads_last, unpack, unsupported

MAX_DIM = 128  # beyond, a chunk of 16 would need more shared memory than consumer GPUs have (see `plan`)
DTYPES = {"cuda": (torch.float32, torch.float16, torch.bfloat16), "cpu": (torch.float32, torch.float16)}

_errors = {}     # device type -> None (usable) or why not


def triton_unsupported(q, v):
    """None when the Triton kernels take this dtype and these head dims on this device, else why not."""
    device_type = q.device.type
    return unsupported(f"the Triton kernels on {device_type} take", DTYPES.get(device_type, ()), MAX_DIM, q, v)


def triton_error(device_type, warn=False):
    """None when the Triton kernels run on device_type, else why not (found once per process:
    import triton, then compile and run forward, backward and step on tiny inputs and compare
    them with the chunked PyTorch form). With warn=True the first failure per device type also
    emits one RuntimeWarning saying that the chunked form is used instead."""
    if device_type not in _errors:
        _errors[device_type] = probe(device_type)
    why = _errors[device_type]
    if why is not None and warn:
        warn_fallback("Triton linear attention", device_type, why)
    return why


def probe(device_type):
    """Why the kernels cannot be used on device_type, or None: see `triton_error`."""
    if device_type == "cuda" and not torch.cuda.is_available():
        return "this torch sees no CUDA GPU"
    if device_type not in DTYPES:
        return f"no Triton kernels for device type {device_type!r}"
    try:
        from . import triton_kernels  # noqa: F401
    except ImportError as exc:
        return f"triton does not import ({exc}); pip install 'imagegen[triton]'"
    if device_type == "cpu" and not interpreting():
        return "CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before triton is imported"
    try:
        with torch.inference_mode(False), torch.enable_grad():     # asked first from a sampler, say
            return check_against_chunked(device_type)
    except Exception as exc:  # compile errors, missing drivers, ...
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        detail = (lines or [type(exc).__name__])[0]
        return f"the kernels failed on {device_type}: {detail[:300]}"


def check_against_chunked(device_type):
    """None when forward, backward and step agree with the chunked form on tiny float32 inputs, else what differs."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 3, generator=gen).to(device_type).requires_grad_() for _ in range(3))
    got = linear_attention_triton(q, k, v, eps=1e-6)
    want = normalise(causal_product_chunked(phi(q), phi(k), with_ones(v)), EPS)
    pairs = [("forward", got, want)]
    pairs += [(f"grad {n}", a, b) for n, a, b in zip("qkv", torch.autograd.grad(got.sum(), (q, k, v)),
                                                     torch.autograd.grad(want.sum(), (q, k, v)))]
    state = torch.zeros(2, 3, 4, device=device_type)
    steps = torch.cat([triton_step(*(t[:, :, i:i + 1].detach() for t in (q, k, v)), state, 1e-6) for i in range(5)], 2)
    pairs.append(("step", steps, want))
    for name, a, b in pairs:
        if not torch.allclose(a, b, rtol=1e-3, atol=1e-3):
            return f"the {name} differs from the chunked form by {(a - b).abs().max().item():.2e}"
    return None


def plan(E, M, dtype, chunk=None, mapped=False):
    """{launch: (kernel name, its constexprs, warps)} for head dims E, M and inputs of dtype;
    mapped: q and k are features already (phi is the identity; see triton_kernels).

    Blocks are powers of two >= 16 (tl.dot's smallest): BEF, BMF cover E, M whole; the state is
    split into blocks BE, BM of <= 64 columns. The chunk C (64 up to dims 32, 32 up to 64, 16
    up to 128) keeps every kernel's shared memory within 99 KiB, the least that an sm_86/sm_89
    GPU allows (compiled for sm_90 in float32 by `triton_compile`: at most 84 KiB; C = 32 at
    dims 128 needed 136). float32 inputs get IEEE float32 dots; half inputs tf32, whose rounding
    is no coarser than theirs."""
    full_e, full_m = (max(16, 1 << max(0, d - 1).bit_length()) for d in (E, M))
    full = max(full_e, full_m)
    C = chunk or (64 if full <= 32 else 32 if full <= 64 else 16)
    BE, BM = min(full_e, 64), min(full_m, 64)
    prec = "ieee" if dtype == torch.float32 else "tf32"
    warps = 4 if full <= 64 else 8
    qk = {"C": C, "BE": BE, "BMF": full_m, "PREC": prec, "MAPPED": mapped}
    return {"forward": ("forward", {"C": C, "BE": full_e, "BM": BM, "PREC": prec, "MAPPED": mapped}, warps),
            "dq": ("backward_qk", {**qk, "REVERSE": False}, warps),
            "dk": ("backward_qk", {**qk, "REVERSE": True}, warps),
            "dv": ("backward_dv", {"C": C, "BEF": full_e, "BM": BM, "PREC": prec, "MAPPED": mapped}, warps),
            "step": ("step", {"BE": full_e, "BM": full_m, "MAPPED": mapped}, 4)}


def launch(planned, device_type, grid, *args):
    """Run one planned kernel (name, constexprs, warps) on device_type over grid."""
    name, constexprs, warps = planned
    options = {} if device_type == "cpu" else {"num_warps": warps}
    kernel(name, device_type)[grid](*args, **constexprs, **options)


def cdiv(a, b):
    return -(-a // b)


def kernel(name, device_type):
    """The kernel `name` for tensors on device_type; CPU tensors need the interpreter."""
    from . import triton_kernels
    if device_type == "cpu" and not interpreting():
        raise RuntimeError("CPU tensors run the Triton kernels only in Triton's interpreter: set TRITON_INTERPRET=1 "
                           "before triton is imported")
    return getattr(triton_kernels, name)


def interpreting():
    """Whether triton was imported with TRITON_INTERPRET=1 (its kernels then run on CPU tensors)."""
    from triton.runtime.interpreter import InterpretedFunction

    from . import triton_kernels
    return isinstance(triton_kernels.forward, InterpretedFunction)


class TritonLinearAttention(torch.autograd.Function):
    """phi, numerator, denominator and division in one kernel forward, three backward (dq, dk, dv);
    keeps 1 / (den + eps) per position beside its inputs and output. Takes q, k, v (N, H, L, E),
    or one tensor (N, L, 3, H, E) holding them, whose gradient then comes back whole; mapped: q, k
    are features already (phi the identity)."""

    @staticmethod
    def forward(ctx, eps, chunk, mapped, *inputs):
        q, k, v = unpack(inputs)
        N, H, L, E = q.shape
        M = v.shape[-1]
        p = plan(E, M, q.dtype, chunk, mapped)
        out = empty_heads_last(v)                               # (N, H, L, M), laid out (N, L, H, M)
        inv = torch.empty(N * H, L, device=q.device, dtype=torch.float32)
        if L:
            launch(p["forward"], q.device.type, (N * H, cdiv(M, p["forward"][1]["BM"])),
                   q, k, v, out, inv, *q.stride(), *k.stride(), *v.stride(), *out.stride(), H, L, E, M, eps)
        ctx.save_for_backward(*inputs, out, inv)
        ctx.chunk, ctx.mapped = chunk, mapped
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        *inputs, out, inv = ctx.saved_tensors
        q, k, v = unpack(inputs)
        N, H, L, E = q.shape
        M = v.shape[-1]
        p, device = plan(E, M, q.dtype, ctx.chunk, ctx.mapped), q.device.type
        g = grad_out.to(out.dtype)
        gd = -(g.float() * out.float()).sum(-1).reshape(N * H, L) * inv      # d loss / d den, (N H, L)
        if len(inputs) == 1:
            grads = (torch.empty_like(inputs[0], memory_format=torch.contiguous_format),)
        else:
            grads = tuple(empty_heads_last(x) for x in inputs)
        dq, dk, dv = unpack(grads)
        strides = (*q.stride(), *k.stride(), *v.stride(), *g.stride())
        if L:
            for name, d in (("dq", dq), ("dk", dk)):
                launch(p[name], device, (N * H, cdiv(E, p[name][1]["BE"])),
                       q, k, v, g, inv, gd, d, *strides, *d.stride(), H, L, E, M)
            launch(p["dv"], device, (N * H, cdiv(M, p["dv"][1]["BM"])),
                   q, k, g, inv, dv, *q.stride(), *k.stride(), *g.stride(), *dv.stride(), H, L, E, M)
        else:
            for t in grads:
                t.zero_()
        if len(inputs) == 1:
            return None, None, None, grads[0] if ctx.needs_input_grad[3] else None
        return (None, None, None, *(t if need else None for t, need in zip(grads, ctx.needs_input_grad[3:])))


def linear_attention_triton(*inputs, eps, chunk=None, mapped=False):
    """Causal linear attention on raw q, k (N, H, L, E), v (N, H, L, M) -> (N, H, L, M), laid out
    (N, L, H, M); or on qkv (N, L, 3, H, E) holding the three. chunk: positions per chunk (a power
    of two >= 16; None: see `plan`). mapped: q, k are features of another map (non-negative where
    the map promises it), taken as they are."""
    if chunk is not None and (chunk < 16 or chunk & (chunk - 1)):
        raise ValueError(f"chunk must be a power of two >= 16 (tl.dot's smallest block), got {chunk}.")
    return TritonLinearAttention.apply(eps, chunk, mapped, *inputs)


def triton_step(q, k, v, state, eps, mapped=False):
    """One decoding position: raw q, k (N, H, 1, E), v (N, H, 1, M) -> (N, H, 1, M), laid out
    (N, 1, H, M); state (N H, E, M + 1), S with z as its last column, is updated in place.
    mapped: q, k are features already."""
    N, H, _, E = q.shape
    M = v.shape[-1]
    out = empty_heads_last(v)
    drop = (lambda t: (t.stride(0), t.stride(1), t.stride(3)))                   # the unit length axis
    launch(plan(E, M, q.dtype, mapped=mapped)["step"], q.device.type, (N * H,),
           q, k, v, state, out, *drop(q), *drop(k), *drop(v), *state.stride(), *drop(out), H, E, M, eps)
    return out
