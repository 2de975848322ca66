"""What makes a run resumable, saved and restored in one place, world-size agnostic.

The position in the data order counts trained images only: it advances after an optimizer step
has been taken, never when a batch is merely drawn, so a stop at any moment (Ctrl-C, SIGTERM,
kill -9) resumes at the first batch not yet trained on. Randomness inside a step (dropout, LSH
hashing) is seeded from (seed, step, rank), so nothing else needs saving.
"""
import math
from dataclasses import asdict, dataclass

import torch


@dataclass
class RunState:
    step: int = 0              # optimizer steps taken
    elapsed: float = 0.0       # seconds spent in training steps (not validation, saving or the kernel build)
    epoch: int = 0             # pass over the training split
    seen: int = 0              # images of this epoch already trained on
    best_val: float = math.inf
    wall: float = 0.0          # wall-clock seconds of those steps (elapsed counts train.clock's)

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d, batch_size):
        """From a checkpoint's "state"; older checkpoints counted batches ("batch") instead of images."""
        seen = d.get("seen", d.get("batch", 0) * batch_size)
        return cls(int(d["step"]), float(d["elapsed"]), int(d["epoch"]), int(seen), float(d["best_val"]),
                   float(d.get("wall", 0.0)))


class DataOrder:
    """Seeded shuffles per epoch over n training images, in global batches of batch_size; a rank
    trains on its slice of each global batch, so the order does not depend on the world size."""

    def __init__(self, n, batch_size, seed, world):
        self.n, self.batch_size, self.seed, self.world = n, batch_size, seed, world
        self._perm = (None, None)

    def perm(self, epoch):
        if self._perm[0] != epoch:
            g = torch.Generator().manual_seed(self.seed * 100003 + epoch)
            self._perm = (epoch, torch.randperm(self.n, generator=g))
        return self._perm[1]

    def batch(self, state):
        """Indices (batch_size / world size,) of this rank's share of the next global batch."""
        if state.seen + self.batch_size > self.n:           # the epoch's remainder is dropped
            state.epoch, state.seen = state.epoch + 1, 0
        start, stop = self.world.shard(self.batch_size)
        return self.perm(state.epoch)[state.seen + start: state.seen + stop]

    def advance(self, state):
        """Count the global batch as trained (call after the optimizer step)."""
        state.seen += self.batch_size


def step_seed(seed, step, rank):
    """The RNG seed of one training step on one rank (dropout, LSH hashing)."""
    return (seed * 1_000_003 + step) * 1009 + rank


class Budget:
    """max_steps and max_minutes: which binds, and the progress bar's estimated total."""

    def __init__(self, max_steps, max_minutes):
        self.max_steps, self.max_seconds = max_steps, 60 * max_minutes if max_minutes else None

    def spent(self, state):
        return state.step >= self.max_steps or (self.max_seconds is not None and state.elapsed >= self.max_seconds)

    def expected_total(self, state, seconds_per_step):
        """Steps the run will end at: max_steps, or fewer when the time budget runs out first."""
        if self.max_seconds is None or not seconds_per_step:
            return self.max_steps
        left = max(0.0, self.max_seconds - state.elapsed) / seconds_per_step
        return min(self.max_steps, state.step + math.ceil(left))
