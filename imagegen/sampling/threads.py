"""How many CPU threads the step sampler uses when the user leaves threads=0: measured, not assumed.

A decoding step is a few small products; torch's threads meet at the end of each one. On a machine
whose other cores are busy, one of them waits for a core at every product, and a step with two
threads took 20-40x as long as with one (docs/notes/speed.md, docs/threads.md). Every command first fits
torch's thread count to the cores free (imagegen.tuning.threads.fit_threads); then, before sampling, a few
steps are timed at the batch in use with that count and with one thread, and the faster is kept
(a fraction of a second; the machine's load changes, so the answer is not cached). IMAGEGEN_PROBE=0,
which turns every measured choice off (`imagegen.tuning.probe`), keeps torch's count as it is.
"""
import time

import torch

from ..tuning import probe
from ..memory import check_batch_fits
from .plan import decoding_state

STEPS = 4          # timed steps per thread count, after one untimed


def step_seconds(model, batch, dtype, threads):
    """Median seconds of one decoding step at this batch with this many torch threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            state = decoding_state(model, batch, next(model.parameters()).device, dtype)
            token = torch.zeros(batch, dtype=torch.long)
            model.step(token, state)
            times = []
            for _ in range(STEPS):
                begin = time.perf_counter()
                model.step(token, state)
                times.append(time.perf_counter() - begin)
        return sorted(times)[len(times) // 2]
    finally:
        torch.set_num_threads(before)


def choose_threads(model, batch, dtype=None):
    """Set torch's thread count to the faster of its default and 1 for this model's step at this
    batch; returns (threads, a line saying what was measured, or None: with one thread there is nothing to
    measure, and fit_threads has said why, once). A batch whose state cannot fit is refused here, in the
    sampler's own sentence, before anything is allocated."""
    check_batch_fits(model, batch, "step", next(model.parameters()).device)
    default = torch.get_num_threads()
    if default == 1:
        return 1, None
    if not probe.enabled():
        return default, f"threads=0: torch's default of {default} threads (IMAGEGEN_PROBE=0: not measured)"
    many, one = step_seconds(model, batch, dtype, default), step_seconds(model, batch, dtype, 1)
    threads = 1 if one < many else default
    torch.set_num_threads(threads)
    return threads, (f"threads=0: {threads} thread{'s' if threads > 1 else ''} (a step at batch {batch} measured "
                     f"{many * 1e3:.1f} ms with {default} threads, {one * 1e3:.1f} ms with 1; threads=N sets it)")
