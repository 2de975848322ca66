"""Choices by measurement, once per machine: a short timing probe decides between two ways of
doing the same work (float32 or bfloat16 products; the fused C++ attention kernel or the chunked
PyTorch form), and its verdict is cached, so that every later process on this machine makes the
same choice without timing anything.

A CPU flag does not say how fast a product runs (an AVX512-BF16 Xeon multiplies bfloat16 slower
than float32; an AVX2-only EPYC runs the fused kernel's backward slower than the chunked form),
so `auto` settings ask `decide(name, measure)`: `measure()` times the baseline and the candidate
(a fraction of a second), and the candidate is chosen only when it is at least MARGIN times faster.

The cache is one JSON file, `cache_path()` ($XDG_CACHE_HOME/imagegen/probes.json, else
~/.cache/imagegen/probes.json), holding each verdict under a key naming the machine: the CPU's model
name and flags, torch's version and the thread count (`machine_key`). A new torch or another thread
count is another key, so it is measured afresh; a damaged or unreadable file is ignored with one
line on stderr (and rewritten when it can be). Within a process a verdict, once made, is never
re-timed: a run's choices stay fixed, and a resumed run reads the same verdicts from the file.

A cached verdict is trusted only while it holds (`stale`): each records the machine's load when it was
timed (the 1-minute load average, less the probe's own threads: the other processes' work), and is timed
again when it was taken on a busy machine (and this one is not busy now), when it is older than MAX_AGE_DAYS,
or when it was marginal (within NEAR of the margin) and is a day old; a verdict of an older cache, which
recorded no load, is timed again once. `listing()` gives every cached verdict with the reason it is trusted
or not (imagegen-bench mode=probes shows them; probes.clear=true removes them: `clear()`).

IMAGEGEN_PROBE=0 turns every probe off: callers then fall back to
their rules (CPU flags for bfloat16, the head-dimension rule for the kernel).
"""
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from functools import lru_cache

import torch

from .machine import cpu_identity, cpu_name
from ..say import say

MARGIN = 1.15          # the candidate must be this many times faster than the baseline to be chosen
BUSY = 0.5             # other processes' load (cores' worth) from which a machine counts as busy
MAX_AGE_DAYS = 30      # a verdict older than this is timed again
NEAR = 1.1             # a ratio within this factor of the margin is marginal: timed again when a day old
ENV_VAR = "IMAGEGEN_PROBE"    # 0/false/no/off: every probe off
VERSION = 1            # of the cache file's layout

_verdicts = {}         # (machine key, name) -> Verdict: made once per process, never re-timed


@dataclass(frozen=True)
class Verdict:
    """A probe's outcome. ratio = baseline time / candidate time (> 1: the candidate is faster);
    chosen: ratio >= the margin; source: 'measured' now or 'cached' (read from `path`)."""
    name: str
    baseline_ms: float
    candidate_ms: float
    chosen: bool
    source: str
    path: str

    @property
    def ratio(self):
        return self.baseline_ms / self.candidate_ms

    def where(self):
        return f"{self.source}, {self.path}" if self.source == "cached" else f"{self.source} now, cached in {self.path}"


def enabled():
    """False when IMAGEGEN_PROBE is 0/false/no/off."""
    return os.environ.get(ENV_VAR, "").strip().lower() not in ("0", "false", "no", "off")


def cache_path():
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "imagegen" / "probes.json"


def machine_key():
    """16 hex digits naming what a timing depends on: CPU model and flags, torch, thread count."""
    return _machine_key(cpu_identity(), torch.__version__, torch.get_num_threads())


@lru_cache(maxsize=None)
def _machine_key(cpu, torch_version, threads):
    return hashlib.sha256(repr((cpu, torch_version, threads)).encode()).hexdigest()[:16]


def read_cache(path):
    """The cache's entries (a dict), or {} when absent, unreadable or damaged (said once, on stderr)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        say(f"ignoring the probe cache {path}: cannot read it ({exc.strerror or exc}); timing again")
        return {}
    try:
        data = json.loads(text)
        entries = data["entries"]
        if data.get("version") != VERSION or not isinstance(entries, dict):
            raise ValueError("unknown layout")
        return entries
    except (ValueError, KeyError, TypeError) as exc:
        say(f"ignoring the probe cache {path}: damaged ({exc}); timing again and rewriting it")
        return {}


def write_cache(path, entries):
    """Write entries through a temporary file and a rename (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"version": VERSION, "entries": entries}, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True) if tmp.parent.is_dir() else None
        say(f"could not write the probe cache {path} ({exc.strerror or exc}); the verdict holds for this process only")


def load_now():
    """The 1-minute load average (runnable processes, in cores' worth), or None where the OS keeps none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def others(load, threads):
    """The other processes' share of a load average measured while `threads` of ours ran."""
    return max(0.0, load - threads) if isinstance(load, (int, float)) else None


def stale(entry, margin=MARGIN, now=None, load=None):
    """Why a valid cached entry must be timed again (a phrase), or None when it can be trusted. now: time.time();
    load: this machine's other load now (others(load_now(), threads))."""
    now = time.time() if now is None else now
    if "load" not in entry:
        return "its machine load was not recorded (an older cache)"
    then = others(entry["load"], entry.get("threads", 1))
    if then is not None and then >= BUSY and (load is None or load < BUSY):
        return f"it was timed while other processes used {then:.1f} cores"
    try:
        days = (now - time.mktime(time.strptime(entry["when"], "%Y-%m-%d %H:%M:%S"))) / 86400
    except (KeyError, TypeError, ValueError, OverflowError):
        return "its date is unreadable"
    if days > MAX_AGE_DAYS:
        return f"it is {days:.0f} days old"
    ratio = entry["baseline_ms"] / entry["candidate_ms"]
    if abs(math.log(ratio / entry.get("margin", margin))) < math.log(NEAR) and days >= 1:
        return f"it was marginal ({ratio:.2f}x against the {entry.get('margin', margin)}x asked)"
    return None


def listing():
    """[(key, entry, reason: None when trusted)] of every valid verdict in the cache, for every machine key."""
    load = others(load_now(), torch.get_num_threads())
    return [(key, entry, stale(entry, load=load)) for key, entry in sorted(read_cache(cache_path()).items())
            if valid_entry(entry)]


def clear():
    """Remove the cache file (every verdict is timed again when next needed); returns how many it held."""
    path = cache_path()
    held = len(read_cache(path))
    path.unlink(missing_ok=True)
    return held


def valid_entry(entry):
    return (isinstance(entry, dict) and all(isinstance(entry.get(k), (int, float)) and entry[k] > 0
                                            for k in ("baseline_ms", "candidate_ms")))


def decide(name, measure, margin=MARGIN):
    """The Verdict for `name` on this machine: from this process's memory, else the cache file, else
    measured now by `measure()` -> (baseline_ms, candidate_ms) and written to the cache. None when
    probes are off (`enabled`): the caller then uses its rule."""
    if not enabled():
        return None
    key = (machine_key(), name)
    if key in _verdicts:
        return _verdicts[key]
    path = cache_path()
    entries = read_cache(path)
    entry = entries.get(f"{key[0]}/{name}")
    why = stale(entry, margin, load=others(load_now(), torch.get_num_threads())) if valid_entry(entry) else None
    if why:
        say(f"timing the {name} probe again: {why}")
    if valid_entry(entry) and not why:
        verdict = Verdict(name, float(entry["baseline_ms"]), float(entry["candidate_ms"]),
                          bool(entry.get("chosen", entry["baseline_ms"] >= margin * entry["candidate_ms"])),
                          "cached", str(path))
    else:
        baseline_ms, candidate_ms = measure()
        verdict = Verdict(name, baseline_ms, candidate_ms, baseline_ms >= margin * candidate_ms, "measured", str(path))
        entries = read_cache(path) if path.exists() else {}     # another process may have written meanwhile
        entries[f"{key[0]}/{name}"] = {"baseline_ms": baseline_ms, "candidate_ms": candidate_ms,
                                       "chosen": verdict.chosen, "margin": margin, "cpu": cpu_name(),
                                       "torch": torch.__version__, "threads": torch.get_num_threads(),
                                       "load": load_now(), "when": time.strftime("%Y-%m-%d %H:%M:%S")}
        write_cache(path, entries)
    _verdicts[key] = verdict
    return verdict


def clock():
    """The clock a probe reads: this thread's CPU time when torch runs on one thread (all the work is
    then ours, and CPU time does not count the waits that other processes' load adds to wall time
    on a shared machine), else wall time (what several threads save is wall time)."""
    return time.thread_time() if torch.get_num_threads() == 1 else time.perf_counter()


def best_ms(baseline, candidate, rounds=5, budget_s=0.5, give_up=4.0, timer=clock):
    """(baseline_ms, candidate_ms): the best of up to `rounds` interleaved calls of each (read on `timer`:
    `clock` for CPU work, the wall clock for calls that wait for a GPU), after one warm-up call of each;
    stops early past budget_s seconds, or after the first round when the candidate is `give_up` times
    slower (an emulated product need not be timed five times to lose)."""
    for fn in (baseline, candidate):
        fn()
    best = [float("inf"), float("inf")]
    start = time.perf_counter()
    for _ in range(rounds):
        for i, fn in enumerate((baseline, candidate)):
            t0 = timer()
            fn()
            best[i] = min(best[i], max(timer() - t0, 1e-6) * 1e3)
        if time.perf_counter() - start > budget_s or best[1] > give_up * best[0]:
            break
    return best[0], best[1]
