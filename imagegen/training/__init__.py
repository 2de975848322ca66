"""The training loop and what keeps a run safe: run state, run folder, logs, signals, torchrun."""

__all__ = ["distributed", "logs", "rundir", "runstate", "signals", "trainer", "travel"]
