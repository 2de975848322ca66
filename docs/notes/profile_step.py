"""Where a preset's training step spends its CPU time (docs/recipe.md, the attention kernel's share): the
preset's model on random sub-pixels, forward and backward under bfloat16 autocast at one thread, profiled by
torch.profiler over three steps after two warm-up steps; prints the step's CPU seconds and the top operators.

    python docs/notes/profile_step.py [PRESET [DATA [BATCH]]]     # default: cpu_cifar cifar10 16
"""
import sys
import time

import torch
from omegaconf import OmegaConf
from torch.profiler import ProfilerActivity, profile

from imagegen import config
from imagegen.commands.cli import compose
from imagegen.data.sets import dataset_info
from imagegen.dtypes import autocast
from imagegen.model.transformer import build_model

preset, data, batch = (sys.argv[1:] + ["cpu_cifar", "cifar10", "16"][len(sys.argv) - 1:])[:3]
config.register()
torch.set_num_threads(1)
cfg = OmegaConf.to_container(compose("train", [f"preset={preset}", f"data={data}", "run_dir=x"]), resolve=False)
info = dataset_info(cfg["data"])
model = build_model(cfg["model"], info).train()
x = torch.randint(0, 256, (int(batch), info.length))
y = torch.randint(0, 10, (int(batch),))


def step():
    with autocast(torch.device("cpu"), True):
        loss = model.nll(x, y).mean()
    loss.backward()


for _ in range(2):
    step()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    tick = time.process_time()
    for _ in range(3):
        step()
    seconds = (time.process_time() - tick) / 3
print(f"{preset} on {data}, batch {batch}, one thread, bfloat16 autocast: {seconds:.3f} CPU seconds a step "
      "(under the profiler)")
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
