"""Timing shared by the benchmarks: medians in ms, CUDA synchronised. On the CPU with one torch thread
the clock is this thread's CPU time (all the work is then the calling thread's, and on a shared
machine CPU time leaves out the waits other processes' load adds to wall time: under nice on a busy
2-core machine a process got ~15% of a core, and wall-clock medians timed the scheduler); with more
threads, or on CUDA, wall time. Page faults are counted beside the times (`minor_faults`): a call that
maps fresh memory pays one per 4 KiB page, which shows as time that grows faster than the work."""
import statistics
import time

try:
    import resource
except ImportError:                  # not on Windows
    resource = None

import torch


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device):
    """The clock the benchmarks read on `device` (see the module's docstring)."""
    return time.thread_time if device.type == "cpu" and torch.get_num_threads() == 1 else time.perf_counter


def minor_faults():
    """Minor page faults of this process so far (getrusage's ru_minflt; 0 where there is no getrusage)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource else 0


def time_all(fns, device, repeat, faults=None):
    """Median wall time in ms of each fn, timed in interleaved rounds (one call of each per
    round, after a warm-up round) so that load from other processes hits all alike. faults: a
    dict to fill with each fn's minor page faults per timed call (their total / repeat)."""
    times = {name: [] for name in fns}
    counted = {name: 0 for name in fns}
    now = clock(device)
    for r in range(repeat + 1):
        for name, fn in fns.items():
            sync(device)
            f0, t0 = minor_faults(), now()
            fn()
            sync(device)
            if r:
                times[name].append((now() - t0) * 1e3)
                counted[name] += minor_faults() - f0
    if faults is not None:
        faults.update({name: n / repeat for name, n in counted.items()})
    return {name: statistics.median(t) for name, t in times.items()}


def median_ms(fn, device, repeat):
    """Median wall time in ms of fn over `repeat` calls after one warm-up call."""
    return time_all({"fn": fn}, device, repeat)["fn"]


def backward_over_forward(fwd_ms, fwd_bwd_ms):
    """The backward's time over the forward's, (fwd+bwd - fwd) / fwd; None where the two timings are
    too close to tell the backward apart (fwd+bwd measured no slower than fwd alone: noise)."""
    return (fwd_bwd_ms - fwd_ms) / fwd_ms if fwd_bwd_ms > fwd_ms else None
