"""Which implementation of causal linear attention runs: `resolve_impl` checks the arguments and turns
impl (maybe "auto") into one of IMPLS (see imagegen/ops/__init__.py), `decide_impl` is auto's choice
(measured once per machine by `imagegen.tuning.probe`: on the CPU the fused kernel against
chunked, on CUDA the csrc kernel against Triton where it is built; else by rule), and the decoding
predicates say which step a sampler can run.
"""
import time

import torch

from ..tuning import probe
from ..tuning.choice import Choice
from .build import kernel_error, load_kernel, prebuilt_error
from .causal_linear import EPS, causal_product_chunked, check_qkv, normalise, phi, with_ones
from .kernel import causal_product_kernel, kernel_unsupported, linear_attention_kernel
from .triton_linear import linear_attention_triton, triton_error, triton_unsupported

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


def decide_impl(q, v, fused=False, explain=False):
    """Choice(the implementation "auto" runs for q (N, H, L, E), v (N, H, L, M), why); fused: for
    `linear_attention` (phi and the normalisation inside), else for the bare numerator. The reason's
    words are made only where `explain` asks (the training header), not at every forward.

    CUDA, fused: Triton when it imports, takes the dtype (float32/16, bfloat16) and head dims
    (E, M <= 128), and its kernels compile and agree with chunked on this device (checked once
    per process; a failure warns once, naming the cause); else chunked. Not fused: chunked.
    Where Triton runs and the csrc CUDA kernel is built already (`python -m imagegen.ops cuda`;
    auto never waits for its first build, minutes long), the two are timed once per GPU model
    (`cuda_verdict`, cached like the CPU's) and the kernel runs when it is probe.MARGIN times faster
    (docs/notes/code-measurements.md).
    CPU: the kernel (float32/64, bfloat16) when it built and either no gradient is needed or
    max(E, M) <= 193; else chunked (a rule read from one AVX-512 Xeon's timings, which
    docs/notes/code-measurements.md keeps). Another CPU can differ (on an AVX2-only one the fused
    kernel trained slower than chunked), so on the CPU, where the kernel is built, the choice is a
    measurement (`cpu_verdict`, made once per machine and cached; `imagegen.tuning.probe`): the kernel only
    when it is probe.MARGIN times faster than chunked. With probes off (IMAGEGEN_PROBE=0) the rule above.
    """
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or v.requires_grad)
    passes = "fwd+bwd" if needs_grad else "fwd"
    if q.device.type in TRITON_DEVICES:
        if not fused:
            return Choice("chunked", "the bare numerator has no Triton form")
        if (why := triton_unsupported(q, v) or triton_error(q.device.type, warn=True)) is not None:
            return Choice("chunked", f"Triton unavailable: {why}")
        verdict = cuda_verdict(q, v, needs_grad)
        if verdict is None:
            why = explain and (kernel_unsupported(q, v) or prebuilt_error(q.device.type) or "probes off")
            return Choice("triton", f"the CUDA kernel is not timed: {why}" if explain else "")
        return Choice("kernel" if verdict.chosen else "triton", f"the CUDA kernel {passes} measured "
                      f"{verdict.ratio:.2f}x Triton's speed here, {verdict.where()}" if explain else "")
    if q.device.type != "cpu" or kernel_unsupported(q, v) is not None or kernel_error("cpu", warn=True) is not None:
        return Choice("chunked", "no CPU kernel here" if q.device.type == "cpu" else f"no kernel on {q.device.type}")
    verdict = cpu_verdict(q.shape[-2], q.shape[-1], v.shape[-1], q.dtype, fused, needs_grad)
    if verdict is not None:
        return Choice("kernel" if verdict.chosen else "chunked", f"{'fused ' if fused else ''}kernel {passes} "
                      f"measured {verdict.ratio:.2f}x chunked's speed here, {verdict.where()}" if explain else "")
    if needs_grad and max(q.shape[-1], v.shape[-1]) > CPU_KERNEL_MAX_DIM:
        return Choice("chunked", "by rule, probes off: training at a head dim above 192")
    return Choice("kernel", "by rule, probes off")


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


def time_forms(baseline, candidate, device, P, L, E, M, dtype, needs_grad, mapped=False):
    """(baseline ms, candidate ms) for two forms f(q, k, v) of the same attention on (1, P, L, E/M) inputs on
    device (q, k feature-mapped first when mapped), forward+backward (needs_grad) or forward, without
    autocast: the best of a few interleaved calls (`probe.best_ms`; on a GPU each call waited for and read on
    the wall clock), with a generator of its own (the global random state is left alone, so that a run's
    draws do not depend on whether it probed)."""
    g = torch.Generator(device=device).manual_seed(0)
    q, k = (torch.randn(1, P, L, E, generator=g, device=device).to(dtype) for _ in range(2))
    v = torch.randn(1, P, L, M, generator=g, device=device).to(dtype)
    if mapped:
        q, k = phi(q), phi(k)
    leaves = [x.requires_grad_(needs_grad) for x in (q, k, v)]
    grad = torch.randn(1, P, L, M, generator=g, device=device).to(dtype)

    def run(form):
        with torch.autocast(device.type, enabled=False), torch.set_grad_enabled(needs_grad):
            out = form(*leaves)
            if needs_grad:
                torch.autograd.grad(out, leaves, grad)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    timer = time.perf_counter if device.type == "cuda" else probe.clock
    return probe.best_ms(lambda: run(baseline), lambda: run(candidate), rounds=5, budget_s=1.0, timer=timer)


def time_impls(L, E, M, dtype, fused, needs_grad):
    """(chunked ms, kernel ms) on the CPU (`time_forms`) on (1, 2 x threads, L, E/M) inputs (the kernel
    runs one (n, h) pair per thread at a time); fused: the forms `linear_attention` runs for impl chunked
    and kernel, else the bare numerator's."""
    def chunked(q, k, v):
        return causal_product_chunked(q, k, v, default_chunk_size(q))

    def chunked_attention(q, k, v):
        return normalise(chunked(phi(q), phi(k), with_ones(v)), EPS)

    def kernel_attention(q, k, v):
        return linear_attention_kernel(q, k, v, eps=EPS)

    forms = (chunked_attention, kernel_attention) if fused else (chunked, causal_product_kernel)
    return time_forms(*forms, torch.device("cpu"), 2 * torch.get_num_threads(), L, E, M, dtype, needs_grad,
                      mapped=not fused)


def cuda_verdict(q, v, needs_grad):
    """The probe's Verdict (candidate: the csrc CUDA kernel, baseline: Triton) for `linear_attention`
    on q (N, H, L, E), v (N, H, L, M)'s GPU model, dtype and head dims, forward+backward (needs_grad) or
    forward; None when probes are off or the kernel is not built yet (or cannot take these inputs)."""
    device = q.device
    if kernel_unsupported(q, v) is not None or prebuilt_error(device.type) is not None:
        return None
    L, E, M = probe_length(q.shape[-2]), q.shape[-1], v.shape[-1]
    build = load_kernel(device.type).__name__.rsplit("_", 1)[-1]
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    name = (f"impl-attention-{'fwd_bwd' if needs_grad else 'fwd'}:{str(q.dtype).replace('torch.', '')}:L{L}:E{E}:"
            f"M{M}:{gpu}:kernel-{build}")
    return probe.decide(name, lambda: time_gpu_impls(device, L, E, M, q.dtype, needs_grad))


def time_gpu_impls(device, L, E, M, dtype, needs_grad):
    """(Triton ms, kernel ms) for `linear_attention` on (1, 8, L, E/M) inputs on device (`time_forms`)."""
    def triton_attention(q, k, v):
        return linear_attention_triton(q, k, v, eps=EPS)

    def kernel_attention(q, k, v):
        return normalise(causal_product_kernel(phi(q), phi(k), with_ones(v)), EPS)
    return time_forms(triton_attention, kernel_attention, device, 8, L, E, M, dtype, needs_grad)


def auto_impl_line(model_cfg, L, device, bf16=False):
    """The training header's line on what impl=auto runs for a linear model (config dict model_cfg,
    sequences of L positions, bfloat16 autocast or not) on the CPU or CUDA; None for other models and devices."""
    impl = (model_cfg.get("attention_options") or {}).get("impl", "auto")
    if model_cfg.get("attention") != "linear" or impl != "auto" or device.type not in ("cpu", *TRITON_DEVICES):
        return None
    E = model_cfg["d_model"] // model_cfg["n_heads"]
    dtype = torch.bfloat16 if bf16 else torch.float32
    q = torch.empty(1, 1, L, E, dtype=dtype, device=device, requires_grad=True)
    with torch.enable_grad():
        choice = decide_impl(q, q, fused=True, explain=True)
    return f"linear attention impl=auto: {choice.value} ({choice.reason})"


def resolve_impl(q, k, v, impl, chunk_size, fused=False):
    """Check the arguments and turn impl (maybe "auto") into the implementation to run;
    fused: for `linear_attention`, the only op "triton" runs."""
    if impl not in IMPLS:
        raise ValueError(f"unknown causal product impl {impl!r}; choose one of {', '.join(IMPLS)}.")
    check_qkv(q, k, v)
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int or None (tuned default), got {chunk_size!r}.")
    if impl == "auto":
        return decide_impl(q, v, fused).value
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
