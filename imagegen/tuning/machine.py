"""What this machine is: the CPU (read from /proc/cpuinfo once per process), what it offers for
bfloat16 and int8 products, and how much memory a device has free.

Capabilities answer "can it", never "is it fast": which of two ways is faster is measured
(`imagegen.tuning.probe`), because a flag does not say how fast a product runs.
"""
import os
import platform
from functools import lru_cache
from pathlib import Path

import torch


@lru_cache(maxsize=None)
def cpuinfo():
    """/proc/cpuinfo's text, or '' where there is none (read once per process)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_identity():
    """The CPU's model name and instruction-set flags (the lines that say what code runs fast on
    it), or what platform says where there is no /proc/cpuinfo."""
    keep = [line for line in cpuinfo().splitlines()
            if line.split(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join(sorted(set(keep))) if keep else (platform.processor() or platform.machine())


def cpu_name():
    """The CPU's model name with its family and model numbers where /proc/cpuinfo gives them ('AMD EPYC,
    family 25 model 17': a virtual machine's name alone does not tell a Zen 4 from a Zen 5), else what
    platform says."""
    fields = {}
    for line in cpuinfo().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if "model name" not in fields:
        return platform.processor() or platform.machine() or "unknown CPU"
    numbers = (f", family {fields['cpu family']} model {fields['model']}"
               if fields.get("cpu family", "").isdigit() and fields.get("model", "").isdigit() else "")
    return fields["model name"] + numbers


def cpu_flags():
    """The CPU's instruction-set flags (the first 'flags' line of /proc/cpuinfo), or an empty set."""
    for line in cpuinfo().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _torch_flag(name):
    fn = getattr(torch.cpu, name, None)            # private, so looked up with care
    try:
        return None if fn is None else bool(fn())
    except Exception:                               # noqa: BLE001  (a broken probe is an unknown, not a crash)
        return None


@lru_cache(maxsize=None)
def cpu_bf16_report():
    """{'amx': bool, 'avx512_bf16': bool}: what this CPU offers for bfloat16 products, from torch's
    CPU capability probes, falling back to the /proc/cpuinfo flags where torch has none."""
    report = {}
    for key, check, flag in (("amx", "_is_amx_tile_supported", "amx_bf16"),
                             ("avx512_bf16", "_is_avx512_bf16_supported", "avx512_bf16")):
        found = _torch_flag(check)
        report[key] = flag in cpu_flags() if found is None else found
    return report


def fast_bf16(device, report=None):
    """(fast, reason): whether `device` has native bfloat16 products (CUDA with bfloat16; a CPU with
    AMX tiles or AVX512-BF16), and a few words why. report: a `cpu_bf16_report`-shaped dict (tests
    pass a mocked one)."""
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


def has_vnni():
    """Whether the CPU has 8-bit dot products (AVX512-VNNI or AVX-VNNI); torch's own check first."""
    found = _torch_flag("_is_vnni_supported")
    return bool({"avx512_vnni", "avx_vnni"} & cpu_flags()) if found is None else found


def available_bytes(device):
    """Free memory of `device`: the GPU's free bytes, or the system's MemAvailable for the CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
