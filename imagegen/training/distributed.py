"""Process group, rank and device per rank, reductions: everything else asks this module
"am I rank 0?" and "what is my slice?" instead of reading environment variables.

Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK set) `setup` joins the process group (nccl on
CUDA, gloo on the CPU) with a bounded collective timeout, so that when one rank dies the others
stop with one sentence instead of waiting forever, and `teardown` ends it while Python is fully
alive. Without torchrun it is a world of one and every call below is a no-op.
"""
import importlib
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import UserError
from .signals import watch_parent

TIMEOUT_S = float(os.environ.get("IMAGEGEN_DIST_TIMEOUT", "300"))   # a collective waiting longer: a rank died


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: str = "cpu"          # where collectives' tensors live (nccl needs them on the GPU)

    @property
    def main(self):
        return self.rank == 0

    @property
    def distributed(self):
        return self.size > 1

    def shard(self, n):
        """The contiguous slice [start, stop) of n items that this rank owns (sizes differ by at most 1)."""
        return self.rank * n // self.size, (self.rank + 1) * n // self.size


def from_env():
    """The World torchrun describes in the environment (a world of one without it)."""
    try:
        return World(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                     int(os.environ.get("LOCAL_RANK", 0)))
    except ValueError:
        raise UserError("RANK, WORLD_SIZE or LOCAL_RANK is not an integer; start imagegen with torchrun, "
                        "which sets them, or unset them.") from None


def setup(device):
    """Join the process group when launched by torchrun; returns (World, the device of this rank)."""
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
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=TIMEOUT_S))
    return World(world.rank, world.size, world.local_rank, str(device)), device


def teardown(world):
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


COMM_ERRORS = ("gloo", "nccl", "connection", "timed out", "timeout", "broken pipe", "peer")


def lost(world, e):
    """The UserError for a RuntimeError raised by a collective (ours or DDP's) when a rank died or hung;
    None for any other error (a bug to show in full)."""
    text = str(e).strip()
    if not world.distributed or not (isinstance(e, dist.DistError) or any(w in text.lower() for w in COMM_ERRORS)):
        return None
    first = text.splitlines()[0][:160] if text else type(e).__name__
    return UserError(f"another training process stopped or stopped answering ({first}); run the same "
                     f"command again to resume from the last checkpoint.")


def collective(world, fn):
    """Run a collective; a rank that died turns the timeout or broken connection into one sentence."""
    try:
        return fn()
    except RuntimeError as e:
        raise (lost(world, e) or e) from None


def reduce_(world, values, op):
    t = torch.tensor(values, dtype=torch.float64, device=world.device)
    if world.distributed:
        collective(world, lambda: dist.all_reduce(t, op=op))
    return t.tolist()


def sum_(world, values):
    """Sum float64 values over all ranks (exact sums of NLLs and counts); a list back."""
    return reduce_(world, values, dist.ReduceOp.SUM)


def max_(world, values):
    """Element-wise max over all ranks; a list back (used to agree on stop flags and rank 0's clock)."""
    return reduce_(world, values, dist.ReduceOp.MAX)
