"""Wall-clock timing shared by the benchmarks: medians in ms, CUDA synchronised."""
import statistics
import time

import torch


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_all(fns, device, repeat):
    """Median wall time in ms of each fn, timed in interleaved rounds (one call of each per
    round, after a warm-up round) so that load from other processes hits all alike."""
    times = {name: [] for name in fns}
    for r in range(repeat + 1):
        for name, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            if r:
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def median_ms(fn, device, repeat):
    """Median wall time in ms of fn over `repeat` calls after one warm-up call."""
    return time_all({"fn": fn}, device, repeat)["fn"]
