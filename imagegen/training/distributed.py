"""Joining and leaving the process group (the world and its reductions: imagegen/world.py).

Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK set) `setup` joins the process group (nccl on
CUDA, gloo on the CPU) with a bounded collective timeout, so that when one rank dies the others
stop with one sentence instead of waiting forever, and `teardown` ends it while Python is fully
alive. Without torchrun it is a world of one and every call below is a no-op.
"""
import importlib
from datetime import timedelta

import torch
import torch.distributed as dist

from ..world import World, from_env
from .signals import watch_parent

def setup(device, timeout_s=300.0):
    """Join the process group when launched by torchrun; returns (World, the device of this rank). A collective
    waiting longer than timeout_s (imagegen-train's dist_timeout_s) stops it: another rank died."""
    world = from_env()
    if not world.distributed:
        return world, device
    watch_parent()                  # the launcher's death stops this rank as SIGTERM would
    if device.type == "cuda":
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # torch.distributed.nn's functions take `group=group.WORLD` as a default argument, evaluated
        # when the module is first imported; DDP imports it (through torch._dynamo) after the group
        # exists, so the defaults would keep the group, and gloo's threads, alive past teardown into
        # interpreter exit, where a thread still releasing a finished collective's tensor needs the
        # GIL and aborts the process ("terminate called without an active exception", ~1 run in 4 of
        # a small repro). Imported first, the defaults hold None and teardown joins gloo's threads.
        importlib.import_module("torch.distributed.nn")   # not `import torch.distributed.nn`: that binds a local
                                                           # `torch` and breaks torch.device above on CUDA
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s))
    return World(world.rank, world.size, world.local_rank, str(device)), device


def teardown(world):
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()
