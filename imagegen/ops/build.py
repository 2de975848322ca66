"""The compiled kernels of csrc/: built on first use, loaded, or why not (`python -m imagegen.ops`
builds the CPU kernel now, `python -m imagegen.ops cuda` the CUDA one).

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
from dataclasses import dataclass
from pathlib import Path

import torch

from ..lock import exclusive, fcntl   # fcntl is None on Windows: builds are not serialised across processes
from ..paths import data_dir
# the CPU's name is in the build key: a shared build folder never serves one CPU's code to another
from ..tuning.machine import cpu_identity
from ..say import apart_from_bars, say

CSRC = data_dir("csrc")
# CPU: one file per job (the numerator, the fused attention, the whole-model decoding step, its int8
# products, the sampler's draw, torch's CPU allocator) and the module
SOURCES = {"cpu": ["numerator.cpp", "fused_attention.cpp", "decode_step.cpp", "int8_linear.cpp", "draw.cpp",
                   "allocator.cpp", "bindings.cpp"],
           "cuda": ["causal_product_cuda.cu"]}
# included by the sources (qkv_checks.h by both): part of the build key
HEADERS = ["cpu_kernel.h", "vec.h", "gelu.h", "qkv_checks.h"]
BUILD_TIME = {"cpu": "about a minute", "cuda": "several minutes"}



@dataclass
class Switches:
    """This process's kernel switches."""
    compile: bool = True    # False: take the kernel only when an earlier process has built it (`prebuilt_only`)
    recycle: bool = False   # True: CPU tensors through the kernel's allocator once it loads (`recycle_freed_blocks`)


_modules = {}  # device type -> built module, or why it cannot be built
switches = Switches()
_warned = set()  # (what, device type) pairs whose fallback has been announced


class KernelUnavailable(RuntimeError):
    """The compiled causal product cannot be used on this device; the message says why."""


def _build(device_type, may_compile=True):
    """Compile (or reuse the build of) and import the extension for 'cpu' or 'cuda'; raise KernelUnavailable
    (at once, naming how to build it, when there is no finished build and may_compile is false)."""
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
    if device_type == "cpu":
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

    if not may_compile and not (build_dir / "done").is_file():
        raise KernelUnavailable("not built yet, and this command does not wait for its first compile; " + (
            "`python -m imagegen.ops cuda` builds it once for every later run" if device_type == "cuda" else
            "`python -m imagegen.ops` or any imagegen-train builds it once for every later run"))

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


def load_kernel(device_type):
    """The built extension module for 'cpu' or 'cuda', built at most once per process;
    raises KernelUnavailable with the cause when it cannot be had."""
    if device_type not in _modules:
        try:
            _loaded(device_type, _build(device_type, may_compile=switches.compile))
        except KernelUnavailable as exc:
            _modules[device_type] = str(exc)
    module = _modules[device_type]
    if isinstance(module, str):
        # a new exception each time: raising a kept one would add this call's frames to its traceback,
        # keeping alive whatever they hold (a DDP wrapper, and through it the process group, past teardown)
        raise KernelUnavailable(module)
    return module


def draw_kernel():
    """The CPU kernel for sampling's draws (mixture probabilities, guidance, the inverse CDF) wherever this
    process can have it (`kernel_error`: built now unless `prebuilt_only`), else None. One rule whatever ran
    before in the process, so that the same seed draws the same bytes after any other model."""
    return None if kernel_error("cpu") is not None else _modules["cpu"]


def _loaded(device_type, module):
    """Keep a module just built or loaded, and give torch the CPU one's allocator where asked."""
    _modules[device_type] = module
    if device_type == "cpu" and switches.recycle:
        module.use_recycling_allocator()


def recycle_freed_blocks():
    """torch's CPU tensors allocated through the CPU kernel's allocator (csrc/allocator.cpp: its freed
    blocks are what malloc hands out for the next tensor of the same size; torch's own are not): at
    once when the kernel is loaded or built already, else as soon as this process loads it. Never
    compiles for it. True when in place now."""
    switches.recycle = True
    if prebuilt_error("cpu") is not None:
        return False
    return _modules["cpu"].use_recycling_allocator()


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
            with apart_from_bars():          # said from inside a sampling loop: not glued to its progress bar
                warnings.warn(f"imagegen: {what} unavailable on {device_type} ({why}); falling back to the chunked "
                              f"PyTorch form.", FallbackWarning, stacklevel=5)
        finally:
            warnings.formatwarning = shown


def prebuilt_error(device_type):
    """None when the kernel for device_type is loaded or already built (loading it now), else why not;
    never compiles, and a "not built yet" is not remembered, so a later `kernel_error` may still build."""
    if device_type in _modules:
        return kernel_error(device_type)
    try:
        _loaded(device_type, _build(device_type, may_compile=False))
        return None
    except KernelUnavailable as exc:
        return str(exc)


def prebuilt_only():
    """From now on in this process take the kernel only if it is built already (commands that should
    answer in seconds, like imagegen-sample: its first compile takes a minute, longer than the sampling
    it would speed up; the PyTorch form samples the same model meanwhile)."""
    switches.compile = False


def ensure_kernel(device_type):
    """Build (or load) the kernel for device_type now, before anything is timed: the first
    build takes a minute or more. None when the kernel is usable, else why not (warned once)."""
    return kernel_error(device_type, warn=True)


def main(argv):
    """`python -m imagegen.ops [cpu|cuda]`: build that kernel now (default cpu), or say why it cannot be."""
    usage = f"usage: python -m imagegen.ops [{'|'.join(SOURCES)}]"
    if argv in (["--help"], ["-h"]):
        print(f"{usage}\nbuild the compiled kernel of the linear attention for that device now (default cpu), once "
              f"for every later run, or say why it cannot be built.")
        return
    if len(argv) > 1 or (argv and argv[0] not in SOURCES):
        raise SystemExit(f"{usage} (got {' '.join(argv)})")
    device_type = argv[0] if argv else "cpu"
    why = kernel_error(device_type)      # the error says it; no fallback line: nothing falls back here
    if why:
        raise SystemExit(f"error: the {device_type} kernel cannot be built: {why}")
    print(f"the {device_type} kernel is built")


if __name__ == "__main__":      # the old spelling, python -m imagegen.ops.build (runpy warns: the package imports it)
    main(sys.argv[1:])
