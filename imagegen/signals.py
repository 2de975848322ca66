"""Stop requests: SIGTERM (a job scheduler) and SIGINT (Ctrl-C) ask training to stop at the next
step boundary, where it saves and exits; a second signal stops at once without saving (the last
checkpoint stays as it was, as after kill -9)."""
import signal


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
