"""What a run's state weighs in a pack, per preset (docs/runs.md): for each preset a run folder is written as
imagegen-train writes it (last.pt and best.pt of the preset's model, its optimizer after one step so that the
moments exist, the average of the weights where the preset keeps one) and packed with imagegen-run's own code,
exact and compact. No training: the sizes do not depend on the values.

    python docs/notes/pack_sizes.py            # a table in Markdown, about a minute on 2 cores
"""
import copy
import tempfile
from pathlib import Path

import torch
from omegaconf import OmegaConf

from imagegen import config
from imagegen.commands.cli import compose
from imagegen.config.schema import TrainOptions
from imagegen.config.typed import typed
from imagegen.data.sets import dataset_info
from imagegen.model.transformer import build_model
from imagegen.store import checkpoint
from imagegen.training.runstate import RunState
from imagegen.training.optim import make_optimizer
from imagegen.training.travel import pack_run

MIB = 2 ** 20
config.register()
print("| preset | parameters | optimizer, average | last.pt | exact pack (best=weights) | exact, best=none | compact pack "
      "(best=weights) | compact, best=none |")
print("|---|---|---|---|---|---|---|---|")
# cpu_cifar has the shipped cifar10-linear's context (sixteen distances) in three blocks; the old recipe's four blocks
# and optimizer (AdamW with an average of the weights), cifar10-linear's sizes, are the last row
OLD = ["model.n_layers=4", "train.optimizer=adamw", "train.ema=0.999"]
for preset, data, more in (("cpu_mnist", "mnist", []), ("cpu_cifar", "cifar10", []), ("paper_mnist", "mnist", []),
                            ("paper_cifar", "cifar10", []), ("cpu_cifar", "cifar10", OLD)):
    cfg = OmegaConf.to_container(compose("train", [f"preset={preset}", f"data={data}", "run_dir=x", *more]),
                                 resolve=False)
    torch.manual_seed(0)
    model = build_model(cfg["model"], dataset_info(cfg["data"]))
    opt = make_optimizer(model, typed(TrainOptions, cfg["train"]))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    extra = {"ema": copy.deepcopy(model).state_dict()} if cfg["train"]["ema"] else {}
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        ck = {"config": cfg, "model": model.state_dict(), **extra, "optimizer": opt.state_dict(),
              "state": RunState(step=1).to_dict()}
        for name in ("last.pt", "best.pt"):
            checkpoint.save(run / name, ck)
        sizes = []
        for state, best in (("exact", "weights"), ("exact", "none"), ("compact", "weights"), ("compact", "none")):
            out = Path(tmp) / f"{state}-{best}"
            written = pack_run(run, out, state, best, max_files=100, say=lambda _: None)
            sizes.append(f"{sum(p.stat().st_size for p in written) / MIB:.1f} MiB in {len(written)} files")
        n = sum(p.numel() for p in model.parameters())
        name = f"{preset} (the old recipe: 4 blocks; cifar10-linear)" if more else preset
        print(f"| {name} | {n / 1e6:.2f}M | {cfg['train']['optimizer']}, {'ema' if extra else 'none'} | "
              f"{(run / 'last.pt').stat().st_size / MIB:.1f} MiB | " + " | ".join(sizes) + " |", flush=True)
