"""Timing shared by the benchmarks: medians in ms, CUDA synchronised. On the CPU with one torch thread
the clock is this thread's CPU time (all the work is then the calling thread's, and on a shared
machine CPU time leaves out the waits other processes' load adds to wall time: under nice on a busy
2-core machine a process got ~15% of a core, and wall-clock medians timed the scheduler); with more
threads, or on CUDA, wall time."""
import statistics
import time

import torch


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device):
    """The clock the benchmarks read on `device` (see the module's docstring)."""
    return time.thread_time if device.type == "cpu" and torch.get_num_threads() == 1 else time.perf_counter


def time_all(fns, device, repeat):
    """Median wall time in ms of each fn, timed in interleaved rounds (one call of each per
    round, after a warm-up round) so that load from other processes hits all alike."""
    times = {name: [] for name in fns}
    now = clock(device)
    for r in range(repeat + 1):
        for name, fn in fns.items():
            sync(device)
            t0 = now()
            fn()
            sync(device)
            if r:
                times[name].append((now() - t0) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def median_ms(fn, device, repeat):
    """Median wall time in ms of fn over `repeat` calls after one warm-up call."""
    return time_all({"fn": fn}, device, repeat)["fn"]


def backward_over_forward(fwd_ms, fwd_bwd_ms):
    """The backward's time over the forward's, (fwd+bwd - fwd) / fwd; None where the two timings are
    too close to tell the backward apart (fwd+bwd measured no slower than fwd alone: noise)."""
    return (fwd_bwd_ms - fwd_ms) / fwd_ms if fwd_bwd_ms > fwd_ms else None
