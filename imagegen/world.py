"""The world of processes a command runs in (one without torchrun) and its reductions: `World` says
"am I rank 0?" and "what is my slice?", `sum_` and `max_` add up or agree on values across ranks, and
a collective that fails because a rank died becomes one sentence (`lost`). Joining and leaving the
process group: imagegen.training.distributed.
"""
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .errors import UserError


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
