"""glibc malloc tuned for running models on the CPU (imagegen.ops.allocator.for_device, which every
command and imagegen.load call, sets it up with the kernel's allocator)."""
import ctypes
import sys


def keep_freed_memory():
    """Make glibc's malloc keep freed memory for reuse (no mmap for large blocks, no trimming).
    By default it hands every block over 32 MB (most activations of a batch of 3072-long
    sequences) back to the system when freed, so each training step faults its pages in and
    zeroes them again; see docs/training.md for the measured effect. Meant for a process that repeats
    one pattern of allocations (training steps): with ever new sizes the heap can only grow.
    True when the setting was made."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt                    # glibc; absent under other C libraries
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4                      # from glibc's malloc.h
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))

