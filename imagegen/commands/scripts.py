"""The console scripts (pyproject.toml's [project.scripts]): each answers --help from the typed
configs without importing torch, and hands anything else to its command's module (cli.COMMAND_TABLE)."""
from .cli import launcher

train, eval, sample, bench, plot, export, convert = map(
    launcher, ("train", "eval", "sample", "bench", "plot", "export", "convert"))
