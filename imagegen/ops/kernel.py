"""The compiled causal product (csrc/): build on first use, wrap in autograd.

`causal_product_kernel(q, k, v)` computes the same numerator as the pure-PyTorch forms,
V'_i = sum_{j<=i} (q_i . k_j) v_j for q, k (N, H, L, E) and v (N, H, L, M), with the
recurrent forward and the constant-memory backward of Algorithm 1.

The C++ sources (CPU: float32, float64, and bfloat16 summed in float32; one file per job, listed in
csrc/cpu_kernel.h) are built with
torch.utils.cpp_extension.load the first time it is needed, into a folder of torch's extension
root (TORCH_EXTENSIONS_DIR, else torch's default) named by a hash of the sources, the compile
flags, torch and Python (`build_key`): checkouts with other sources never build over each other,
and an unchanged one reuses its build in every later process without a compiler. A real compile
says so on stderr, before and after; concurrent processes take turns through an OS file lock
that dies with its holder (`locked_build`), so a killed build never leaves a lock that stops
the next one. The CUDA source (float32/float16/bfloat16) is built only when this torch has
CUDA. A failed or impossible build is tried once per process: `load_kernel` then raises
KernelUnavailable naming the cause, and `kernel_error` returns it, so callers can fall back
loudly; `ensure_kernel` builds up front, so that callers can keep the build out of their timing.
Set IMAGEGEN_DISABLE_KERNEL=1 to never build (the chunked form is used instead).
"""
import hashlib
import importlib.util
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from ..lock import exclusive, fcntl   # fcntl is None on Windows: builds are not serialised across processes
from ..paths import data_dir
# the CPU's name is in the build key: a shared build folder never serves one CPU's code to another
from ..probe import cpu_identity
from ..precision import dtype_name

CSRC = data_dir("csrc")
# CPU: one file per job (the numerator, the fused attention, the whole-model decoding step) and the module
SOURCES = {"cpu": ["numerator.cpp", "fused_attention.cpp", "decode_step.cpp", "bindings.cpp"],
           "cuda": ["causal_product_cuda.cu"]}
# included by the sources (qkv_checks.h by both): part of the build key
HEADERS = ["cpu_kernel.h", "vec.h", "qkv_checks.h"]
BUILD_TIME = {"cpu": "about a minute", "cuda": "several minutes"}
DTYPES = {"cpu": (torch.float32, torch.float64, torch.bfloat16),
          "cuda": (torch.float32, torch.float16, torch.bfloat16)}
MAX_CUDA_DIM = 256  # largest E and M the CUDA kernel supports (csrc/causal_product_cuda.cu)

_modules = {}  # device type -> built module, or why it cannot be built
_compile = [True]  # False: take the kernel only when an earlier process has built it (`prebuilt_only`)
_warned = set()  # (what, device type) pairs whose fallback has been announced


class KernelUnavailable(RuntimeError):
    """The compiled causal product cannot be used on this device; the message says why."""


def _build(device_type):
    """Compile (or reuse the build of) and import the extension for 'cpu' or 'cuda'; raise KernelUnavailable."""
    from torch.utils import cpp_extension

    if os.environ.get("IMAGEGEN_DISABLE_KERNEL", "") not in ("", "0"):
        raise KernelUnavailable("disabled by IMAGEGEN_DISABLE_KERNEL")
    if device_type not in SOURCES:
        raise KernelUnavailable(f"no compiled causal product for device type {device_type!r}")
    sources = [CSRC / s for s in SOURCES[device_type]]
    files = sources + [CSRC / h for h in HEADERS]
    missing = [str(s) for s in files if not s.is_file()]
    if missing:
        raise KernelUnavailable(f"kernel sources not found: {', '.join(missing)}")
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise KernelUnavailable(f"no C++ compiler: {cxx!r} is not on PATH (set CXX)")
    # no-tree-loop-distribute-patterns: GCC would turn the short row copies into memmove calls
    cflags, ldflags = ["-O3", "-fno-tree-loop-distribute-patterns"], []
    if device_type == "cpu" and os.environ.get("IMAGEGEN_KERNEL_NATIVE", "1") != "0":
        # this CPU's vector width (the key names the CPU: see cpu_identity); no clones (see vec.h)
        cflags += ["-march=native", "-DCP_NATIVE"]
    if torch.backends.openmp.is_available():  # at::parallel_for uses OpenMP pragmas in headers
        cflags.append("-fopenmp")
        ldflags.append("-fopenmp")
    kwargs = {}
    if device_type == "cuda":
        if not (torch.cuda.is_available() and torch.version.cuda):
            raise KernelUnavailable("this torch has no usable CUDA")
        if cpp_extension.CUDA_HOME is None:
            raise KernelUnavailable("CUDA toolkit (nvcc) not found: set CUDA_HOME")
        # nvcc's -O sets host-code optimisation only (device code is optimised regardless);
        # leaving it out saves minutes of gcc time on torch's headers.
        kwargs["extra_cuda_cflags"] = []
    key = build_key(files, cxx, cflags, ldflags, kwargs,
                    cpp_extension.CUDA_HOME if device_type == "cuda" else cpu_identity())
    name = f"imagegen_causal_product_{device_type}_{key}"  # module name and folder name
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    build_dir = Path(root) / name

    if not _compile[0] and not (build_dir / "done").is_file():
        raise KernelUnavailable("not built yet, and this command does not wait a minute for its first compile; "
                                "`python -m imagegen.ops.kernel` or any imagegen-train builds it once for every "
                                "later run")

    def build():
        return cpp_extension.load(name=name, sources=[str(s) for s in sources], extra_cflags=cflags,
                                  extra_ldflags=ldflags, build_directory=str(build_dir), verbose=False, **kwargs)

    try:
        return locked_build(build_dir, build, lambda: import_built(name, build_dir / f"{name}.so"),
                            what=f"the C++ kernel for {device_type}", duration=BUILD_TIME[device_type])
    except Exception as exc:  # compiler errors, ninja missing, import errors, ...
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error:" in ln.lower()]  # the compiler's first diagnostic
        detail = (errors or lines or [type(exc).__name__])[0]
        detail = detail if len(detail) <= 300 else detail[:300] + "..."
        raise KernelUnavailable(f"building the {device_type} extension failed: {detail}") from exc


def build_key(files, *settings):
    """12 hex digits naming a build: a hash of the files' names and contents, the settings
    (compiler, flags, ...), torch's version and the Python ABI the module is built for."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{Path(f).name}\0".encode())
        digest.update(Path(f).read_bytes())
    digest.update(repr((settings, torch.__version__, torch.version.git_version,
                        sys.implementation.cache_tag)).encode())
    return digest.hexdigest()[:12]


def import_built(name, path):
    """Import the extension module `name` from its built library `path` (what cpp_extension.load
    does once the library is up to date, without running ninja and the compiler checks first)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def locked_build(build_dir, build, load, what, duration="about a minute"):
    """`build()` into build_dir at most once across processes, then `load()` the result.

    A file `done` in build_dir marks a finished build: when present, `load()` runs at once,
    silently. Otherwise the builder holds an OS lock (flock on build_dir/imagegen.lock, released
    by the kernel when its process ends, however it ends) while it compiles, with a line on stderr
    before and after; a process that finds the lock taken says it waits, waits, and then loads
    the result. torch's own lock file (build_dir/lock, which cpp_extension.load leaves behind
    when killed, and then waits on for good) is removed when found while we hold our lock: its
    owner must have died, since every builder takes our lock first.
    """
    done = build_dir / "done"
    if done.is_file():
        return load()
    build_dir.mkdir(parents=True, exist_ok=True)
    def wait(owner):
        say(f"waiting for process {owner.get('pid', '?')}, which is compiling {what} in {build_dir} ...")

    with exclusive(build_dir / "imagegen.lock", wait):
        if done.is_file():  # built by the process we waited for
            return load()
        stale = build_dir / "lock"
        if fcntl is not None and stale.exists():  # without our lock, it may be a live build's
            say(f"removing torch's build lock {stale}, left by a build that was killed")
            stale.unlink(missing_ok=True)
        say(f"compiling {what} (first use, {duration}) ...")
        start = time.perf_counter()
        try:
            module = build()
        except BaseException:
            say(f"compiling {what} failed after {time.perf_counter() - start:.0f} s")
            raise
        done.write_text(f"built by process {os.getpid()} in {time.perf_counter() - start:.0f} s\n")
        say(f"compiling {what} done in {time.perf_counter() - start:.0f} s")
        return module


def say(line):
    print(f"imagegen: {line}", file=sys.stderr, flush=True)


def load_kernel(device_type):
    """The built extension module for 'cpu' or 'cuda', built at most once per process;
    raises KernelUnavailable with the cause when it cannot be had."""
    if device_type not in _modules:
        try:
            _modules[device_type] = _build(device_type)
        except KernelUnavailable as exc:
            _modules[device_type] = str(exc)
    module = _modules[device_type]
    if isinstance(module, str):
        # a new exception each time: raising a kept one would add this call's frames to its traceback,
        # keeping alive whatever they hold (a DDP wrapper, and through it the process group, past teardown)
        raise KernelUnavailable(module)
    return module


def kernel_error(device_type, warn=False):
    """None when the kernel for device_type is usable (building it now if needed), else why
    not. With warn=True the first failure per device type also emits one RuntimeWarning
    saying that the chunked form is used instead."""
    try:
        load_kernel(device_type)
        return None
    except KernelUnavailable as exc:
        if warn:
            warn_fallback("causal product kernel", device_type, exc)
        return str(exc)


class FallbackWarning(RuntimeWarning):
    """A faster form is unavailable and the chunked PyTorch form runs instead (printed as its one line)."""


def warn_fallback(what, device_type, why):
    """One FallbackWarning (a RuntimeWarning) per process for each (what, device_type): `what` is
    unavailable there, why, and that the chunked PyTorch form runs instead. Shown as that one line on
    stderr, without the file, line number and source line of whichever caller ran first (they read like
    leaked code); filters apply as to any warning (-W error raises it, pytest records it)."""
    if (what, device_type) not in _warned:
        _warned.add((what, device_type))
        why = " ".join(str(why).split())
        shown = warnings.formatwarning
        warnings.formatwarning = lambda message, category, *where: (
            f"{message}\n" if issubclass(category, FallbackWarning) else shown(message, category, *where))
        try:
            warnings.warn(f"imagegen: {what} unavailable on {device_type} ({why}); falling back to the chunked "
                          f"PyTorch form.", FallbackWarning, stacklevel=5)
        finally:
            warnings.formatwarning = shown


def prebuilt_only():
    """From now on in this process take the kernel only if it is built already (commands that should
    answer in seconds, like imagegen-sample: its first compile takes a minute, longer than the sampling
    it would speed up; the PyTorch form samples the same model meanwhile)."""
    _compile[0] = False


def ensure_kernel(device_type):
    """Build (or load) the kernel for device_type now, before anything is timed: the first
    build takes a minute or more. None when the kernel is usable, else why not (warned once)."""
    return kernel_error(device_type, warn=True)


def unsupported(takes, dtypes, max_dim, q, v):
    """None when what `takes` names (say "the cpu kernel supports") takes q's dtype, one of `dtypes`,
    and head dims E = q.shape[-1], M = v.shape[-1] up to max_dim (None: any), else a sentence why not."""
    if q.dtype not in dtypes:
        return f"{takes} {', '.join(map(dtype_name, dtypes)) or 'no dtype'}, got {dtype_name(q.dtype)}"
    if max_dim is not None and max(q.shape[-1], v.shape[-1]) > max_dim:
        return f"{takes} head dims E, M <= {max_dim}, got E={q.shape[-1]}, M={v.shape[-1]}"
    return None


def kernel_unsupported(q, v):
    """None when the kernel handles this dtype/shape on this device, else a sentence why not."""
    device_type = q.device.type
    return unsupported(f"the {device_type} kernel supports", DTYPES.get(device_type, ()),
                       MAX_CUDA_DIM if device_type == "cuda" else None, q, v)


class CausalProduct(torch.autograd.Function):
    """Autograd wrapper: forward and backward both call the compiled kernel."""

    @staticmethod
    def forward(ctx, q, k, v):
        module = load_kernel(q.device.type)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        ctx.save_for_backward(q, k, v)
        return module.forward(q, k, v)  # (N, H, L, M)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        if not any(ctx.needs_input_grad):
            return None, None, None
        module = load_kernel(q.device.type)
        grads = module.backward(q, k, v, grad_out.to(v.dtype).contiguous())
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad))


def causal_product_kernel(q, k, v):
    """Compiled causal numerator for q, k (N, H, L, E), v (N, H, L, M) -> (N, H, L, M)."""
    return CausalProduct.apply(q, k, v)


def unit_last_stride(x):
    return x if x.stride(-1) == 1 else x.contiguous()


class FusedLinearAttention(torch.autograd.Function):
    """The CPU kernel's fused attention: phi, numerator, denominator and division in one sweep
    forward and two backward; keeps only 1 / (den + eps) per position beside its inputs and output.
    Takes q, k, v (N, H, L, E), or one tensor (N, L, 3, H, E) holding them (as a projection makes
    them), whose gradient then comes back whole rather than as three pieces to concatenate."""

    @staticmethod
    def forward(ctx, eps, *inputs):
        inputs = tuple(unit_last_stride(x) for x in inputs)   # saved so: backward copies nothing again
        out, inv = load_kernel("cpu").attention_forward(*unpack(inputs), eps)
        ctx.save_for_backward(*inputs, out, inv)
        return out  # (N, H, L, M), laid out (N, L, H, M)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        *inputs, out, inv = ctx.saved_tensors
        if len(inputs) == 1:
            grads = (torch.empty_like(inputs[0], memory_format=torch.contiguous_format),)
        else:
            grads = tuple(empty_heads_last(x) for x in inputs)
        load_kernel("cpu").attention_backward(*unpack(inputs), out, inv, unit_last_stride(grad_out.to(out.dtype)),
                                              *unpack(grads))
        return (None, *(g if need else None for g, need in zip(grads, ctx.needs_input_grad[1:])))


def unpack(inputs):
    """(q, k, v) from [q, k, v] or [qkv (N, L, 3, H, E)], as (N, H, L, E) views."""
    return inputs[0].permute(2, 0, 3, 1, 4).unbind(0) if len(inputs) == 1 else inputs


def empty_heads_last(x):
    """An uninitialised tensor shaped like x (N, H, L, D), laid out (N, L, H, D)."""
    N, H, L, D = x.shape
    return x.new_empty(N, L, H, D).transpose(1, 2)


def linear_attention_kernel(*inputs, eps):
    """Fused CPU attention on raw q, k (N, H, L, E), v (N, H, L, M) -> (N, H, L, M), or on
    qkv (N, L, 3, H, E) holding the three (see FusedLinearAttention)."""
    return FusedLinearAttention.apply(eps, *inputs)


def fused_state(like, batch_heads, E, M):
    """A zero decoding state (S and z of each of batch_heads heads, float32 for bfloat16) for `fused_step`."""
    return load_kernel("cpu").attention_state(like, batch_heads, E, M)


def fused_step(q, k, v, state, eps):
    """One decoding position through the fused CPU kernel: raw q, k (N, H, 1, E), v (N, H, 1, M)
    -> (N, H, 1, M), laid out (N, 1, H, M); state (from `fused_state`) is updated in place."""
    return load_kernel("cpu").attention_forward(q, k, v, eps, state)[0]


class DecodeLayer(NamedTuple):
    """The tensors of one block that `decode_step` reads, in the order it reads them: the C++ names
    them in one list (csrc/cpu_kernel.h, DECODE_LAYER_WEIGHTS), which the built module exports as
    `decode_layer_weights`; tests/test_ops.py checks that it equals these fields. The products'
    weights and biases (qkv, out, ff1, ff2) are those of the decoding state, in the products' dtype
    (`Dense.cast`: bfloat16 copies for bfloat16 decoding, prepacked for oneDNN at larger batches);
    the LayerNorms' are the parameters; state is the block's `fused_state`, advanced in place."""
    ln1_weight: torch.Tensor
    ln1_bias: torch.Tensor
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor
    out_weight: torch.Tensor
    out_bias: torch.Tensor
    ln2_weight: torch.Tensor
    ln2_bias: torch.Tensor
    ff1_weight: torch.Tensor
    ff1_bias: torch.Tensor
    ff2_weight: torch.Tensor
    ff2_bias: torch.Tensor
    state: torch.Tensor


class DecodeHead(NamedTuple):
    """The head's tensors that `decode_step` reads, in order (csrc/cpu_kernel.h, DECODE_HEAD_WEIGHTS;
    the module's `decode_head_weights`): the final LayerNorm and the output projection."""
    ln_f_weight: torch.Tensor
    ln_f_bias: torch.Tensor
    proj_weight: torch.Tensor
    proj_bias: torch.Tensor


def decode_step(h, layers, head, n_heads, ln_eps, eps):
    """One decoding position of a whole linear PixelTransformer in one C++ call (see
    `PixelTransformer.kernel_weights`): h (N, D) embedded tokens, layers a DecodeLayer per block,
    head a DecodeHead -> parameters (N, P)."""
    return load_kernel("cpu").decode_step(h, layers, head, n_heads, ln_eps, eps)


if __name__ == "__main__":                      # python -m imagegen.ops.kernel: build the CPU kernel now
    why = ensure_kernel("cpu")
    raise SystemExit(f"error: the C++ kernel cannot be built: {why}" if why else "the C++ kernel is built")
