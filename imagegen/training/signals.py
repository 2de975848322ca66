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


def watch_parent(interval=0.5, signum=signal.SIGTERM):
    """Send this process `signum` (by default a stop request, as from a job scheduler) when its parent
    dies: a rank whose launcher (torchrun) was killed with kill -9 stops, saving, instead of
    training on as an orphan holding the run dir. A daemon thread polls the parent's pid (portable,
    and unlike PR_SET_PDEATHSIG unaffected by which of the parent's threads started us)."""
    import os
    import threading

    parent = os.getppid()
    if parent <= 1:                      # already an orphan, or started by init: nothing to watch
        return None

    def watch():
        while os.getppid() == parent:
            time.sleep(interval)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=watch, name="imagegen-parent-watch", daemon=True)
    thread.start()
    return thread
