"""Training runs as subprocesses, a few at once, that a signal stops cleanly: the sweep that
imagegen-bench mode=paper and mode=speedrun share. Each job's output goes to a log of its own; SIGINT and
SIGTERM are forwarded to the running jobs (they save and exit), which run in sessions of their own and
watch this process (CHILD), so that a kill -9 of it leaves no orphan training on."""
import signal
import subprocess
import time
from pathlib import Path

# the child: imagegen-train (its console script: a stop while it starts is one line too), stopping (and
# saving) as on SIGTERM when the sweep dies
CHILD = ("import sys; from imagegen.training.signals import watch_parent; watch_parent(); "
         "from imagegen.commands.scripts import train; sys.argv[0] = 'imagegen-train'; train()")


def hydra_value(v):
    """A value as a Hydra command-line override writes it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{hydra_value(x)}" for k, x in v.items()) + "}"
    return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"


def tail(path, n=15):
    """The last n lines a log's latest process wrote (after its "$ command" line)."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    starts = [i for i, line in enumerate(lines) if line.startswith("$ ")]
    return "\n".join(lines[starts[-1] + 1 if starts else 0:][-n:])


def sweep(jobs, n_slots):
    """Run jobs [(name, argv, log path)] as subprocesses, at most n_slots at once. SIGINT / SIGTERM
    are forwarded to the running ones (they save and exit), no new one starts, and KeyboardInterrupt
    is raised once they are gone. Returns the names of the jobs that failed on their own."""
    pending, running, failed, stop, said = list(jobs), {}, [], [], {}

    def forward(signum, frame):
        if not stop:
            print(f"\n{signal.Signals(signum).name}: asking {len(running)} training run(s) to save and stop; run "
                  f"the same command again to resume", flush=True)
        stop.append(signum)
        for proc, _, _ in running.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while running or (pending and not stop):
            while pending and len(running) < n_slots and not stop:
                name, argv, log_path = pending.pop(0)
                log_path.parent.mkdir(parents=True, exist_ok=True)
                log = open(log_path, "a")
                log.write(f"\n$ {' '.join(argv)}\n")
                log.flush()
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
                running[name] = (proc, log, time.perf_counter())
                print(f"training {name} (log: {log_path})", flush=True)
                if stop:                             # a signal between the start and the line above
                    proc.send_signal(stop[0])
            for name, (proc, log, started) in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                log.close()
                del running[name]
                if code == 0:
                    print(f"trained {name} ({time.perf_counter() - started:.0f} s)", flush=True)
                elif not stop:
                    failed.append(name)
                    end = tail(log.name)
                    print(f"training {name} failed (exit status {code}); " + (
                        f"its log ends as {said[end]}'s did" if end in said else f"the end of its log:\n{end}"),
                        flush=True)
                    said.setdefault(end, name)
            time.sleep(0.1)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if stop:
        raise KeyboardInterrupt
    return failed
