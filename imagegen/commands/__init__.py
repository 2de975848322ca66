"""The console scripts: one module per command (train, evaluate, sample, bench, plot, export, convert,
prepare), each wiring the library's pieces to its Hydra config; cli.py is what they share, scripts.py
the entry points pyproject.toml names. No other part of imagegen imports a command."""

__all__ = ["bench", "cli", "convert", "evaluate", "export", "plot", "prepare", "run", "sample", "scripts", "train"]
