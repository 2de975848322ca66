"""Stop requests: SIGTERM (a job scheduler) and SIGINT (Ctrl-C) ask training to stop at the next
step boundary, where it saves and exits; a second signal stops at once without saving (the last
checkpoint stays as it was, as after kill -9)."""
import signal
import time


class StopRequest:
    """A context manager installing the handlers; `.signal` names the first signal received, or is None."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signal, self._previous = None, {}

    def _handle(self, signum, frame):
        if self.signal is not None:
            raise KeyboardInterrupt           # asked twice: stop now
        self.signal = signal.Signals(signum).name

    def __enter__(self):
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        return False


_watch = {}   # the one parent watch of this process: {"pid": ours, "parent": its pid, "thread": Thread}


def torchrun_rank():
    """True in a process that torchrun (or torch.distributed.elastic) started as a rank."""
    import os
    return "TORCHELASTIC_RUN_ID" in os.environ


def _launcher_is_init():
    """True when pid 1 is itself a torch launcher (torchrun as a container's first process)."""
    try:
        with open("/proc/1/cmdline", "rb") as f:
            return b"torch" in f.read()
    except OSError:
        return False


def launcher_gone():
    """In a torchrun rank whose launcher has already exited, the clause saying so; else None. Such a
    rank was adopted by init (pid 1), possibly before any of our code ran (torchrun killed while the
    rank was starting), so no pid recorded at start-up could tell; torchrun never starts a rank as
    init's child, except as init itself (a container's first process), which is checked."""
    import os

    if torchrun_rank() and os.getppid() <= 1 and not _launcher_is_init():
        return "torchrun, which started this rank, exited"
    return None


def watch_parent(interval=0.5, signum=signal.SIGTERM):
    """Send this process `signum` (by default a stop request, as from a job scheduler) when its parent
    dies: a rank whose launcher (torchrun) was killed with kill -9 stops, saving, instead of
    training on as an orphan holding the run dir. A daemon thread polls the parent's pid (portable,
    and unlike PR_SET_PDEATHSIG unaffected by which of the parent's threads started us).

    Once per process: later calls return the first call's thread, which watches the parent that the
    first call saw. A torchrun rank whose launcher has already exited (see launcher_gone) raises
    UserError (one line, before any work); any other process already orphaned or started by init
    has nothing to watch (None)."""
    import os
    import sys
    import threading

    from ..errors import UserError

    if _watch.get("pid") == os.getpid():       # not a forked child's copy of its parent's record
        return _watch["thread"]
    gone = launcher_gone()
    if gone:
        raise UserError(f"{gone} before this training process (pid {os.getpid()}) was up; it stops now "
                        f"instead of waiting for the other ranks. Run the same torchrun command again (it "
                        f"resumes from the last checkpoint).")
    parent = os.getppid()
    if parent <= 1 and not torchrun_rank():    # already an orphan, or started by init: nothing to watch
        return None

    def watch():
        while os.getppid() == parent:
            time.sleep(interval)
        if torchrun_rank():
            print(f"imagegen: the launcher (pid {parent}) of this training process (pid {os.getpid()}) has "
                  f"exited; stopping as on {signal.Signals(signum).name}.", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=watch, name="imagegen-parent-watch", daemon=True)
    _watch.update(pid=os.getpid(), parent=parent, thread=thread)
    thread.start()
    return thread


def watch_launcher():
    """In a torchrun rank, start watch_parent as early as possible (a console script's first lines,
    before torch is imported): from then on the launcher's death stops this rank, and a launcher that
    died even earlier ends it at once with one line. Elsewhere nothing."""
    if torchrun_rank():
        watch_parent()
