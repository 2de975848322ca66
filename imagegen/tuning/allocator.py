"""glibc malloc tuned for running models on the CPU: `for_device`, which every command
(commands.cli.resolve_device) and imagegen.load call once their device is known."""
import ctypes
import os
import sys


def keep_freed_memory():
    """Make glibc's malloc keep freed memory for reuse (no mmap for large blocks, no trimming).
    By default it hands every block over 32 MB (most activations of a batch of 3072-long
    sequences) back to the system when freed, so each training step faults its pages in and
    zeroes them again; see docs/training.md for the measured effect. Meant for a process that repeats
    one pattern of allocations (training steps): with ever new sizes the heap can only grow.
    IMAGEGEN_KEEP_FREED_MEMORY=0 leaves malloc as it is. True when the setting was made."""
    if os.environ.get("IMAGEGEN_KEEP_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt                    # glibc; absent under other C libraries
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4                      # from glibc's malloc.h
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def for_device(device):
    """keep_freed_memory() when `device` (a torch.device) is the CPU: the one place every process that
    runs a model sets malloc up (commands.cli.resolve_device for every command, imagegen.load for the
    Python API). Without it each forward at long lengths maps its large outputs afresh: the numerator's
    forward at 16,384 positions (B 4, H 8, E 32) faulted in 16,385 pages a call and took 2.5x its time
    (docs/notes/speed.md, "Page faults"). True when the setting was made."""
    return device.type == "cpu" and keep_freed_memory()
