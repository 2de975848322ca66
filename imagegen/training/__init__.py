"""The training loop and what keeps a run safe: run state, run folder, logs, signals, torchrun."""
