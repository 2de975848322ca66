"""Causal linear attention ops: `causal_product` (the numerator),
`causal_linear_attention` (normalised, on feature-mapped q, k), `linear_attention`
(the model's: phi(x) = elu(x) + 1 applied here), `mapped_linear_attention` (the model's with
another feature map, applied by the caller) and `gated_linear_attention` (with a decay per
position, gated_linear.py), each with a choice of implementation.

impl names:
  "reference"  quadratic masked product, O(L^2) memory; for tests
  "cumsum"     cumulative sum of k v^T outer products, O(L E M) memory
  "chunked"    masked products inside chunks + carried state (pure PyTorch, any device)
  "kernel"     compiled recurrent kernel of csrc/ (CPU: float32/64, bfloat16; CUDA: float32/16, bfloat16);
               on the CPU `linear_attention` runs it fused with phi and the normalisation.
               On CUDA only when asked for: its source compiles (csrc/compile_check.sh) but has never run
  "triton"     `linear_attention` only: the fused chunked Triton kernels of triton_linear.py (CUDA;
               CPU tensors under Triton's interpreter, for tests)
  "auto"       the fastest available for the device and shape (`choose_impl`: on the CPU measured
               once per machine by `imagegen.probe`, else by rule)
"""
import torch
import torch.nn.functional as F

from .. import probe

from .causal_linear import (EPS, check_qkv, causal_product_chunked, causal_product_cumsum, causal_product_reference,
                            linear_attention_reference)
from .gated_linear import gated_chunked, gated_reference, gated_step
from .kernel import (DecodeHead, DecodeLayer, causal_product_kernel, decode_step, fused_state, fused_step,
                     kernel_error, kernel_unsupported, linear_attention_kernel, load_kernel, warn_fallback)
from .triton_linear import linear_attention_triton, triton_error, triton_step, triton_unsupported

IMPLS = ("reference", "cumsum", "chunked", "kernel", "triton", "auto")
TRITON_DEVICES = ("cuda",)  # device types where "auto" runs `linear_attention` through Triton
CPU_KERNEL_MAX_DIM = 193  # auto on CPU with grad: kernel up to head dim 192 (+ the ones column)


def default_chunk_size(q):
    """Chunk for impl="chunked" when none is given: on CPU the power of two >= E, clamped
    to [32, 128] (the best sizes measured on a CPU, fwd+bwd: docs/notes/code-measurements.md); on other
    devices 64 (not measured)."""
    if q.device.type != "cpu":
        return 64
    return min(128, max(32, 1 << max(0, q.shape[-1] - 1).bit_length()))


def choose_impl(q, v, fused=False):
    """The implementation "auto" runs for q (N, H, L, E), v (N, H, L, M); fused: for
    `linear_attention` (phi and the normalisation inside), else for the bare numerator.

    CUDA, fused: Triton when it imports, takes the dtype (float32/16, bfloat16) and head dims
    (E, M <= 128), and its kernels compile and agree with chunked on this device (checked once
    per process; a failure warns once, naming the cause); else chunked. Not fused: chunked.
    The csrc CUDA kernel is never chosen: it has never run (no GPU here), while the Triton
    kernels' arithmetic is tested under the interpreter on every change.
    CPU: the kernel (float32/64, bfloat16) when it built and either no gradient is needed or
    max(E, M) <= 193; else chunked (a rule read from one AVX-512 Xeon's timings, which
    docs/notes/code-measurements.md keeps). Another CPU can differ (on an AVX2-only one the fused
    kernel trained slower than chunked, issue 22), so on the CPU, where the kernel is built, the
    choice is a measurement (`cpu_verdict`, made once per machine and cached; `imagegen.probe`): the kernel only
    when it is probe.MARGIN times faster than chunked. With probes off (IMAGEGEN_PROBE=0) the rule above.
    """
    if q.device.type in TRITON_DEVICES:
        if not fused or triton_unsupported(q, v) is not None:
            return "chunked"
        return "chunked" if triton_error(q.device.type, warn=True) is not None else "triton"
    if q.device.type != "cpu" or kernel_unsupported(q, v) is not None:
        return "chunked"
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or v.requires_grad)
    if kernel_error(q.device.type, warn=True) is not None:
        return "chunked"
    verdict = cpu_verdict(q.shape[-2], q.shape[-1], v.shape[-1], q.dtype, fused, needs_grad)
    if verdict is not None:
        return "kernel" if verdict.chosen else "chunked"
    if needs_grad and max(q.shape[-1], v.shape[-1]) > CPU_KERNEL_MAX_DIM:
        return "chunked"
    return "kernel"


def probe_length(L):
    """The length a probe times for sequences of length L: the power of two >= L, in [64, 1024]
    (per position the cost hardly depends on L past a few chunks; the probe must stay short)."""
    return min(1024, max(64, 1 << max(0, L - 1).bit_length()))


def cpu_verdict(L, E, M, dtype, fused, needs_grad):
    """The probe's Verdict (candidate: the kernel, baseline: chunked) for the CPU at head dims E, M,
    sequences of about L positions and dtype, forward+backward (needs_grad) or forward; fused: the
    model's `linear_attention`, else the bare numerator. None when probes are off."""
    Lp = probe_length(L)
    build = load_kernel("cpu").__name__.rsplit("_", 1)[-1]      # another kernel source is another verdict
    name = (f"impl-{'attention' if fused else 'numerator'}-{'fwd_bwd' if needs_grad else 'fwd'}:"
            f"{str(dtype).replace('torch.', '')}:L{Lp}:E{E}:M{M}:kernel-{build}")
    return probe.decide(name, lambda: time_impls(Lp, E, M, dtype, fused, needs_grad))


def time_impls(L, E, M, dtype, fused, needs_grad):
    """(chunked ms, kernel ms): best of a few interleaved calls on (1, 2 x threads, L, E/M) inputs
    (the kernel runs one (n, h) pair per thread at a time), with a generator of its own (the
    global random state is left alone, so that a run's draws do not depend on whether it probed)."""
    g = torch.Generator().manual_seed(0)
    P = 2 * torch.get_num_threads()
    q, k = (torch.randn(1, P, L, E, generator=g).to(dtype) for _ in range(2))
    v = torch.randn(1, P, L, M, generator=g).to(dtype)
    if not fused:
        q, k = F.elu(q) + 1, F.elu(k) + 1
    leaves = [x.requires_grad_(needs_grad) for x in (q, k, v)]
    grad = torch.randn(1, P, L, M, generator=g).to(dtype)
    op = linear_attention if fused else causal_product

    def run(impl):
        with torch.autocast("cpu", enabled=False), torch.set_grad_enabled(needs_grad):
            out = op(*leaves, impl=impl)
            if needs_grad:
                torch.autograd.grad(out, leaves, grad)
    return probe.best_ms(lambda: run("chunked"), lambda: run("kernel"), rounds=5, budget_s=1.0)


def auto_impl_line(model_cfg, L, device, bf16=False):
    """The training header's line on what impl=auto runs for a linear model (config dict model_cfg,
    sequences of L positions, bfloat16 autocast or not) on the CPU; None for other models and devices."""
    impl = (model_cfg.get("attention_options") or {}).get("impl", "auto")
    if model_cfg.get("attention") != "linear" or impl != "auto" or device.type != "cpu":
        return None
    E = model_cfg["d_model"] // model_cfg["n_heads"]
    return auto_impl_reason(L, E, E, torch.bfloat16 if bf16 else torch.float32)


def auto_impl_reason(L, E, M, dtype=torch.float32, needs_grad=True):
    """What impl=auto runs for training the model's linear attention on the CPU and why, in a few
    words (for the training header): measured, or the rule when probes are off."""
    q, v = torch.empty(1, 1, L, E, dtype=dtype), torch.empty(1, 1, L, M, dtype=dtype)
    if kernel_unsupported(q, v) is not None or kernel_error("cpu", warn=True) is not None:
        return "linear attention impl=auto: chunked (no CPU kernel here)"
    verdict = cpu_verdict(L, E, M, dtype, True, needs_grad)
    if verdict is None:
        return "linear attention impl=auto: by rule (probes off)"
    return (f"linear attention impl=auto: {'kernel' if verdict.chosen else 'chunked'} (fused kernel "
            f"{'fwd+bwd' if needs_grad else 'fwd'} measured {verdict.ratio:.2f}x chunked's speed here, "
            f"{verdict.where()})")


def resolve_impl(q, k, v, impl, chunk_size, fused=False):
    """Check the arguments and turn impl (maybe "auto") into the implementation to run;
    fused: for `linear_attention`, the only op "triton" runs."""
    if impl not in IMPLS:
        raise ValueError(f"unknown causal product impl {impl!r}; choose one of {', '.join(IMPLS)}.")
    check_qkv(q, k, v)
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int or None (tuned default), got {chunk_size!r}.")
    if impl == "auto":
        return choose_impl(q, v, fused)
    if impl == "triton":
        if not fused:
            raise ValueError("impl='triton' runs the model's linear_attention only (phi and the normalisation "
                             "fused); use impl='chunked' (or 'auto') for the bare product.")
        why = triton_unsupported(q, v) or triton_error(q.device.type)
        if why is not None:
            raise ValueError(f"impl='triton' is unavailable: {why}. Use impl='chunked' (or 'auto').")
    if impl == "kernel":
        why = kernel_unsupported(q, v) or kernel_error(q.device.type)
        if why is not None:
            raise ValueError(f"impl='kernel' is unavailable: {why}. Use impl='chunked' (or 'auto').")
    return impl


def causal_product(q, k, v, impl="auto", chunk_size=None):
    """V'_i = sum_{j<=i} (q_i . k_j) v_j for q, k (N, H, L, E) and v (N, H, L, M) -> (N, H, L, M).

    chunk_size only affects impl="chunked" (any length works, the tail chunk is padded);
    None picks `default_chunk_size(q)`.
    """
    impl = resolve_impl(q, k, v, impl, chunk_size)
    if impl == "kernel":
        return causal_product_kernel(q, k, v)
    if impl == "chunked":
        return causal_product_chunked(q, k, v, chunk_size or default_chunk_size(q))
    if impl == "cumsum":
        return causal_product_cumsum(q, k, v)
    return causal_product_reference(q, k, v)


def causal_linear_attention(q, k, v, impl="auto", eps=EPS, chunk_size=None):
    """Normalised causal linear attention on feature-mapped q, k (N, H, L, E), v (N, H, L, M):
    out_i = sum_{j<=i} (q_i . k_j) v_j / (sum_{j<=i} q_i . k_j + eps) -> (N, H, L, M).

    The denominator comes from the same pass: a ones column appended to v (M + 1 columns).
    """
    ones = torch.ones_like(v[..., :1])
    out = causal_product(q, k, torch.cat([v, ones], dim=-1), impl=impl, chunk_size=chunk_size)
    return out[..., :-1] / (out[..., -1:] + eps)


def phi(x):
    """The feature map of the paper: elu(x) + 1 > 0."""
    return F.elu(x) + 1


def compute_dtype(x):
    """The dtype the PyTorch forms of `linear_attention` compute in for inputs like x: float32
    for float16 and bfloat16 on the CPU (running sums need float32), else x's."""
    return torch.float32 if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def linear_attention(q, k, v, impl="auto", eps=EPS, chunk_size=None):
    """The model's causal linear attention on raw q, k (N, H, L, E) and v (N, H, L, M):
    causal_linear_attention(phi(q), phi(k), v) -> (N, H, L, M). On the CPU, impl "kernel"
    (which "auto" picks there) runs one fused kernel that never materialises phi(q), phi(k) or
    the ones column; q, k, v may be strided views (of one projection, say).

    Never autocast: its running sums need float32. float16/bfloat16 inputs (from an autocast
    projection, say) go to the kernels as they are (they sum in float32); the CPU's chunked form
    computes them in float32 and casts the result back."""
    with torch.autocast(q.device.type, enabled=False):
        impl = resolve_impl(q, k, v, impl, chunk_size, fused=True)
        if impl == "kernel" and q.device.type == "cpu":
            return linear_attention_kernel(q, k, v, eps=eps)
        if impl == "triton":
            return linear_attention_triton(q, k, v, eps=eps)
        dtype = compute_dtype(q)
        if dtype != q.dtype:
            return linear_attention(q.to(dtype), k.to(dtype), v.to(dtype), impl, eps, chunk_size).to(q.dtype)
        return causal_linear_attention(phi(q), phi(k), v, impl=impl, eps=eps, chunk_size=chunk_size)


def mapped_linear_attention(q, k, v, impl="auto", eps=EPS, chunk_size=None):
    """The model's causal linear attention on features q, k (N, H, L, F) of any feature map
    (applied by the caller, whose autograd then carries the gradient through it) and v (N, H, L, M)
    -> (N, H, L, M). impl "kernel" (which "auto" picks on the CPU, by the rule of `choose_impl`)
    runs the compiled numerator kernel on [v, 1] and divides (the fused kernel applies elu + 1
    inside, so it cannot serve); "triton" (which "auto" picks on CUDA where it works) runs the
    Triton kernels with phi the identity (F, M <= 128); other impls as in `causal_linear_attention`."""
    with torch.autocast(q.device.type, enabled=False):
        impl = resolve_impl(q, k, v, impl, chunk_size, fused=True)
        if impl == "triton":
            return linear_attention_triton(q, k, v, eps=eps, mapped=True)
        dtype = compute_dtype(q)
        if dtype != q.dtype:
            return mapped_linear_attention(q.to(dtype), k.to(dtype), v.to(dtype), impl, eps, chunk_size).to(q.dtype)
        return causal_linear_attention(q, k, v, impl=impl, eps=eps, chunk_size=chunk_size)


def gated_linear_attention(q, k, v, log_g, impl="auto", eps=EPS, chunk_size=None):
    """Causal linear attention with a decay per head and position: features q, k (N, H, L, F),
    v (N, H, L, M), log_g (N, H, L) <= 0 -> (N, H, L, M); see gated_linear.py for the recurrence.
    impl "reference" runs the quadratic form; every other the chunked PyTorch form, the only fast
    one: "kernel" and "triton" fall back to it with one warning (neither has the decay)."""
    if impl not in IMPLS:
        raise ValueError(f"unknown gated attention impl {impl!r}; choose one of {', '.join(IMPLS)}.")
    check_qkv(q, k, v)
    if log_g.shape != q.shape[:3]:
        raise ValueError(f"log_g must be (N, H, L) = {tuple(q.shape[:3])}, got {tuple(log_g.shape)}.")
    if impl in ("kernel", "triton"):
        warn_fallback(f"the {impl} form of the gated attention", q.device.type, "the decay is not in those kernels")
    with torch.autocast(q.device.type, enabled=False):
        dtype, out_dtype = compute_dtype(q), q.dtype
        q, k, v, log_g = (t.to(dtype) for t in (q, k, v, log_g))
        if impl == "reference":
            return gated_reference(q, k, v, log_g, eps).to(out_dtype)
        return gated_chunked(q, k, v, log_g, eps, chunk_size or default_chunk_size(q)).to(out_dtype)


def linear_attention_qkv(qkv, n_heads, impl="auto", eps=EPS):
    """`linear_attention` with heads split and merged: qkv (N, L, 3 H E), the queries, keys and
    values of H heads side by side as one projection makes them -> (N, L, H E). The fused CPU
    kernel and the Triton kernels take qkv whole, so that its gradient comes back as one tensor, not three to
    concatenate."""
    N, L, _ = qkv.shape
    heads = qkv.view(N, L, 3, n_heads, -1)
    q, k, v = heads.permute(2, 0, 3, 1, 4)                                  # (N, H, L, E) views
    impl = resolve_impl(q, k, v, impl, None, fused=True)
    with torch.autocast(qkv.device.type, enabled=False):
        if qkv.device.type == "cpu" and impl == "kernel":
            out = linear_attention_kernel(heads, eps=eps)
        elif impl == "triton":
            out = linear_attention_triton(heads, eps=eps)
        else:
            out = linear_attention(q, k, v, impl, eps)                  # impl resolved: not chosen again
    return out.transpose(1, 2).reshape(N, L, -1)


def uses_fused_kernel(impl, like):
    """Whether the fused CPU kernel serves impl ("auto" or "kernel") for tensors like `like`:
    then decoding can step through it too (`fused_state`, `fused_step`)."""
    return (impl in ("auto", "kernel") and like.device.type == "cpu" and kernel_unsupported(like, like) is None
            and kernel_error("cpu", warn=impl == "auto") is None)


def uses_triton_step(impl, like):
    """Whether decoding steps through `triton_step` for impl ("auto" or "triton") and tensors like
    `like`: where "auto" takes Triton for `linear_attention` (CUDA, when it works)."""
    return (impl in ("auto", "triton") and like.device.type in TRITON_DEVICES and triton_unsupported(like, like) is None
            and triton_error(like.device.type, warn=impl == "auto") is None)
