"""What a run dir holds belongs to one run. Called by the trainer on rank 0 once it holds the run
dir's lock, before anything is written:

  start(run_dir, t, cfg, resuming)  a fresh run (nothing to resume) where an earlier run left files:
                                  refused when that run has checkpoints and train.resume=false was
                                  asked without train.overwrite=true (its best.pt may be the better
                                  model); otherwise its files are moved into run_dir/previous-<time>/
                                  (a dead run's metrics rows are never interleaved with this run's);
                                  then the config record .hydra/config.yaml (cfg, the plain dict the
                                  checkpoints hold) and overrides.yaml is written (Hydra itself writes
                                  nothing: see conf/train.yaml); t: the run's TrainOptions.
"""
import os
import time
from pathlib import Path

from ..errors import UserError
from ..say import show
from ..files import OUTPUTS, write_bytes

CHECKPOINTS = ("last.pt", "best.pt")
# A run's own record, besides its checkpoints: moved aside together when a fresh run starts
RECORD_GLOBS = ("last.pt", "best.pt", "*.json", "metrics.jsonl", "events.out.tfevents.*", "samples", ".hydra")


def previous_files(run_dir):
    """The run's own record; not imagegen-sample's record of the images it wrote beside the checkpoints
    (files.OUTPUTS), which stay where they are, and so must their record."""
    return sorted({p for pattern in RECORD_GLOBS for p in Path(run_dir).glob(pattern) if p.name != OUTPUTS})


def set_aside(run_dir, paths):
    """Move `paths` (in run_dir) into a new run_dir/previous-<time>/; returns that folder."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = Path(run_dir) / f"previous-{stamp}"
    n = 1
    while os.path.lexists(folder):
        n += 1
        folder = Path(run_dir) / f"previous-{stamp}-{n}"
    folder.mkdir()
    for p in paths:
        os.replace(p, folder / p.name)
    return folder


def start(run_dir, t, cfg, resuming, say=show):
    if not resuming:
        held = [name for name in CHECKPOINTS if (Path(run_dir) / name).exists()]
        if held and not t.resume and not t.overwrite:
            raise UserError(f"run_dir {run_dir} holds another run's {' and '.join(held)}, which train.resume=false "
                            f"would replace; pass train.overwrite=true to move that run's files into "
                            f"{run_dir}/previous-<time>/ and start over, drop train.resume=false to continue it, "
                            f"or choose another run_dir=...")
        old = previous_files(run_dir)
        if old:
            folder = set_aside(run_dir, old)
            why = "an earlier run's" if held else "a run that stopped before its first checkpoint left"
            say(f"starting over: {why} files ({', '.join(p.name for p in old)}) moved into {folder}")
    record(run_dir, cfg)


def record(run_dir, cfg):
    """run_dir/.hydra/config.yaml (this run's resolved config) and overrides.yaml (its command line)."""
    from omegaconf import OmegaConf
    folder = Path(run_dir) / ".hydra"
    write_bytes(folder / "config.yaml", OmegaConf.to_yaml(cfg).encode(), "config record")
    try:
        from hydra.core.hydra_config import HydraConfig
        overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None
    except (ImportError, ValueError):
        overrides = None
    if overrides is not None:
        write_bytes(folder / "overrides.yaml", OmegaConf.to_yaml(overrides).encode(), "config record")
