"""The console scripts (pyproject.toml's [project.scripts]): each answers --help from the typed
configs without importing torch, and hands anything else to its command's module (cli.COMMAND_TABLE)."""
import sys

try:
    from .cli import launcher
except KeyboardInterrupt:                 # Ctrl-C while the command starts: the one line of cli.interrupted
    print("interrupted", file=sys.stderr, flush=True)
    sys.exit(130)

train, eval, sample, bench, plot, export, convert = map(
    launcher, ("train", "eval", "sample", "bench", "plot", "export", "convert"))
