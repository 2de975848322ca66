"""How many CPU threads torch runs with: as many as there are cores free now, by measurement.

torch's threads meet at the end of every parallel region (each product, each elementwise kernel of
any size). When another process keeps one of the cores busy, the thread that shares that core runs
only in the slices the scheduler gives it, and every other thread waits for it: on a 2-core machine
with a training run on one core, torch's default of two threads ran a sampling step 12-130x and a
training step 4-18x slower than one thread (docs/threads.md). OMP_WAIT_POLICY=PASSIVE, OMP_DYNAMIC
and GOMP_SPINCOUNT=0 narrow the gap but two threads stay slower than one, so the remedy is the
thread count itself.

`free_cores()` counts the cores that stood idle over a short interval (/proc/stat, 0.2 s; the
caller sleeps meanwhile, so its own threads are not counted as load), and `fit_threads(requested)`,
run at start by every command (commands/cli.resolve_device) and by the Python API, sets torch's
thread count: threads=0 (the default) -> the free cores (at least 1, at most torch's default);
threads=N is kept, with one line when N is more than the cores free now, up to the cores this process may run on
(`cores()`): more threads than cores can only wait for each other (threads=10000 made libgomp fail to
create them, or hold 21 GB of stacks), so N is capped there, in one line. Under torchrun the free
cores are shared among the processes of the machine (LOCAL_WORLD_SIZE).

A long run's neighbours come and go: `Watch` follows the trainer's step times and, when the median
of the last window is over SLOWDOWN times the best window's, looks again (never more often than
every LOOK_SECONDS) and drops the thread count to the cores free then, in one line.

IMAGEGEN_PROBE=0 (the tests) measures nothing: threads=0 leaves torch's thread count as it is (the
rule), and the trainer does not watch, so that results do not depend on the machine's load.
"""
import os
import statistics
import time

import torch

from . import probe
from ..config.checks import check_threads
from ..say import say

INTERVAL = 0.2       # seconds of /proc/stat counted
FREE_SHARE = 0.75    # a core counts as free when this much of one stood idle (summed over the cores)
WINDOW = 20          # steps per window of the trainer's watch
SLOWDOWN = 2.0       # a window's median step over this many times the best window's: look again
LOOK_SECONDS = 180   # never look again sooner than this after the last look

DEFAULT = torch.get_num_threads()     # torch's own choice (cores in our affinity, or OMP_NUM_THREADS)
_said = set()                         # (requested, free) lines already said in this process


def allowed_cpus():
    """The core numbers this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def read_stat(path="/proc/stat"):
    """{core number: (idle ticks, total ticks)} from /proc/stat's per-core lines; {} when unreadable."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return {}
    cores = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit():
            continue
        ticks = [int(v) for v in fields[:8]]          # user nice system idle iowait irq softirq steal
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        cores[int(name[3:])] = (idle, sum(ticks))
    return cores


def idle_cores(before, after, cpus):
    """Cores' worth of idle time between two read_stat()s, over the cores in cpus."""
    total = 0.0
    for cpu in cpus:
        if cpu in before and cpu in after:
            ticks = after[cpu][1] - before[cpu][1]
            total += (after[cpu][0] - before[cpu][0]) / ticks if ticks > 0 else 1.0
    return total


def cores():
    """How many cores this process may run on: the most threads that can run at once."""
    return len(allowed_cpus())


def free_cores(interval=INTERVAL, read=read_stat, sleep=time.sleep, cpus=None):
    """How many of our cores are free now: the idle time of the cores this process may use over
    `interval` seconds (this process sleeping meanwhile), counted in whole cores (one counts from
    FREE_SHARE of a core). None when /proc/stat cannot be read (not Linux)."""
    cpus = allowed_cpus() if cpus is None else cpus
    before = read()
    if not before:
        return None
    sleep(interval)
    idle = idle_cores(before, read(), cpus)
    return max(0, min(len(cpus), int(idle + 1 - FREE_SHARE)))


def share(free):
    """This process's share of the free cores: under torchrun, the machine's processes split them."""
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return max(1, free // local)


def fit_threads(requested=0, measure=None, tell=say):
    """Set torch's thread count for this process and return it. requested=0: the cores free now
    (at least 1, at most torch's default); with IMAGEGEN_PROBE=0, or where nothing can be measured,
    torch's count as it stands (the rule). requested=N: N, said once in one line when more than the cores free now;
    at most cores(), said once in one line when N is more. A negative or fractional count: one sentence."""
    check_threads(requested)
    free = (measure or free_cores)() if probe.enabled() else None
    if requested > cores():
        if ("cap", requested) not in _said:
            _said.add(("cap", requested))
            n, s = cores(), "s" * (cores() != 1)
            tell(f"threads={requested}, but this process may run on {n} core{s}: {n} thread{s} (more would only "
                 f"wait for each other)")
        requested = cores()
    elif requested:
        if free is not None and requested > max(1, free) and (requested, free) not in _said:
            _said.add((requested, free))
            tell(f"threads={requested}, but {free} of {len(allowed_cpus())} cores are free now: a thread waiting "
                 f"for a busy core slows every step (threads=0 fits the free cores; docs/threads.md)")
    if requested:
        torch.set_num_threads(int(requested))
        return int(requested)
    if free is None:                           # the rule: torch's count as it stands
        return torch.get_num_threads()
    threads = max(1, min(DEFAULT, share(free)))
    torch.set_num_threads(threads)
    if threads < DEFAULT and ("auto", free) not in _said:
        _said.add(("auto", free))
        tell(f"threads=0: {threads} thread{'s' if threads > 1 else ''}, as {free} of {len(allowed_cpus())} cores "
             f"are free now (threads=N sets it)")
    return threads


class Watch:
    """Follows a long run's step times (`step(seconds)`) and drops torch's thread count to the cores
    free now when the median step of the last WINDOW steps is over SLOWDOWN times the best window's,
    looking at most once every LOOK_SECONDS (the first time LOOK_SECONDS after the start). Returns
    the line it said, or None."""

    def __init__(self, window=WINDOW, slowdown=SLOWDOWN, every=LOOK_SECONDS, measure=None,
                 clock=time.monotonic, tell=say):
        self.window, self.slowdown, self.every = window, slowdown, every
        self.measure, self.clock, self.tell = measure or free_cores, clock, tell
        self.times, self.best, self.last_look = [], None, clock()

    def step(self, seconds):
        self.times.append(seconds)
        if len(self.times) < self.window:
            return None
        median, self.times = statistics.median(self.times), []
        if self.best is None or median < self.best:
            self.best = median
            return None
        if median <= self.slowdown * self.best or self.clock() - self.last_look < self.every:
            return None
        self.last_look = self.clock()
        free, threads = self.measure(), torch.get_num_threads()
        if free is None or share(free) >= threads:
            return None
        fewer = share(free)
        torch.set_num_threads(fewer)
        line = (f"steps slowed to {median * 1e3:.0f} ms (best {self.best * 1e3:.0f} ms), and {free} of "
                f"{len(allowed_cpus())} cores are free now: torch threads {threads} -> {fewer} (threads=N fixes it)")
        self.best = None                       # the new thread count sets its own pace
        self.tell(line)
        return line
