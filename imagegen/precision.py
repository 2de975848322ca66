"""bfloat16 where the hardware multiplies it fast: training autocast, sampling and evaluation.

Training (train.bf16): matrix products run in bfloat16 (float32 accumulation); parameters,
optimizer state, the linear attention's sums (`imagegen.ops.linear_attention`) and the loss stay
float32. Sampling and evaluation (precision=float32|bfloat16|auto): see `resolve_precision`.

"Fast here" is decided by capability, never by vendor: a CUDA device that supports bfloat16, or a
CPU with AMX tiles or AVX512-BF16 (torch's CPU report, else the /proc/cpuinfo flags `amx_bf16`,
`avx512_bf16`). Measured on an AMD EPYC (family 25 model 17, AVX512-BF16, no AMX), 2 threads: a
49152 x 256 x 1024 product takes 68 ms in bfloat16 against 211 ms in float32; on a Xeon with AMX
45 against 162 ms. Without either, bfloat16 products are emulated: on an AMD EPYC with AVX2 only
(family 25 model 1), 23.2 s against 235 ms (99x), and 109 against 1.3 ms at the decoding step's
256 x 256 x 1024 (throwaway script, 2 threads, best of 5). So `auto` never picks bfloat16 there,
asking for it says so (`slow_bf16_note`), and the benchmarks measure it only when named.
"""
from contextlib import nullcontext
from functools import lru_cache

import torch

from .errors import UserError

PRECISIONS = ("float32", "bfloat16", "auto")


def _torch_flag(name):
    fn = getattr(torch.cpu, name, None)            # private, so looked up with care
    try:
        return None if fn is None else bool(fn())
    except Exception:                               # noqa: BLE001  (a broken probe is an unknown, not a crash)
        return None


def _cpuinfo_flags(path="/proc/cpuinfo"):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@lru_cache(maxsize=None)
def cpu_bf16_report():
    """{'amx': bool, 'avx512_bf16': bool}: what this CPU offers for bfloat16 products, from torch's
    CPU capability probes, falling back to the /proc/cpuinfo flags where torch has none."""
    flags = None
    report = {}
    for key, probe, flag in (("amx", "_is_amx_tile_supported", "amx_bf16"),
                             ("avx512_bf16", "_is_avx512_bf16_supported", "avx512_bf16")):
        found = _torch_flag(probe)
        if found is None:
            flags = _cpuinfo_flags() if flags is None else flags
            found = flag in flags
        report[key] = found
    return report


def fast_bf16(device, report=None):
    """(fast, reason): whether bfloat16 products are fast on `device`, and a few words why.
    report: a `cpu_bf16_report`-shaped dict (tests pass a mocked one)."""
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, "CUDA device with bfloat16" if ok else "CUDA device without bfloat16 support"
    if device.type != "cpu":
        return False, f"no bfloat16 rule for device type {device.type}"
    report = cpu_bf16_report() if report is None else report
    if report.get("amx"):
        return True, "CPU has AMX tiles"
    if report.get("avx512_bf16"):
        return True, "CPU has AVX512-BF16"
    return False, "CPU has neither AMX nor AVX512-BF16"


def has_fast_bf16(device):
    """CUDA devices that support bfloat16, and CPUs with AMX tiles or AVX512-BF16."""
    return fast_bf16(device)[0]


def use_bf16(setting, device, key="train.bf16"):
    """The bf16 setting (auto, true or false) resolved for `device`."""
    if setting == "auto":
        return has_fast_bf16(device)
    if isinstance(setting, bool):
        return setting
    raise UserError(f"{key} must be auto, true or false, not {setting!r}.")


def bf16_reason(setting, device):
    """Which precision training runs in and why, for the training header."""
    fast, why = fast_bf16(device)
    if setting == "auto":
        return f"{'bfloat16 autocast' if fast else 'float32'} (train.bf16=auto: {why})"
    slow = f"; slow here: {why}, so bfloat16 products are emulated" if setting and not fast else ""
    return f"{'bfloat16 autocast' if setting else 'float32'} (train.bf16={str(setting).lower()}{slow})"


def slow_bf16_note(dtype, device):
    """One line when `dtype` is bfloat16 on a device where bfloat16 products are slow, else None."""
    fast, why = fast_bf16(device)
    if dtype != torch.bfloat16 or fast:
        return None
    return f"note: bfloat16 is slow here ({why}): its products are emulated, many times slower than float32."


def resolve_precision(setting, device, key="precision"):
    """precision=float32|bfloat16|auto -> torch.float32 or torch.bfloat16 (auto: bfloat16 where fast)."""
    if setting not in PRECISIONS:
        raise UserError(f"{key} must be one of {', '.join(PRECISIONS)}, not {setting!r}.")
    if setting == "auto":
        setting = "bfloat16" if has_fast_bf16(device) else "float32"
    return torch.bfloat16 if setting == "bfloat16" else torch.float32


def resolve_precisions(settings, device, key):
    """A benchmark's list of precisions (float32|bfloat16|auto each) -> (the distinct dtype names to
    measure, in order; a line saying why bfloat16 is left out or slow here, or None). `auto` adds
    bfloat16 only where it is fast, so the defaults do not spend an hour on emulated products."""
    names = list(dict.fromkeys(dtype_name(resolve_precision(s, device, key)) for s in settings))
    if "bfloat16" in names:
        return names, slow_bf16_note(torch.bfloat16, device)
    if "auto" in settings:
        return names, f"bfloat16 not measured: {fast_bf16(device)[1]} ({key}=[float32,bfloat16] measures it anyway)."
    return names, None


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def autocast(device, enabled):
    """A bfloat16 autocast context for `device` when enabled, else a no-op context."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else nullcontext()
