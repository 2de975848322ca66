"""Exact negative log-likelihood of a set of images, summed in float64, split across ranks."""
import math

import torch
from tqdm import tqdm

from .memory import check_forward_fits
from .world import World, sum_

LN2 = math.log(2)


@torch.no_grad()
def total_nll(model, x, batch_size, device, progress=False, desc="eval", world=World(), labels=None):
    """Sum of -log p in nats over all images and sub-pixels of x (B, D) uint8 (given labels (B,) for a
    class-conditional model, if any); each rank scores its shard and the float64 sums are added up,
    so any world size gives the same figure. A batch (at most the shard) that cannot fit in memory is
    one sentence before the first."""
    start, stop = world.shard(len(x))
    check_forward_fits(model, max(1, min(batch_size, stop - start)), device, asked=batch_size)
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64)
    for i in tqdm(range(start, stop, batch_size), desc=desc, disable=not progress, leave=False):
        y = None if labels is None else labels[i:min(i + batch_size, stop)].to(device)
        total += model.nll(x[i:min(i + batch_size, stop)].to(device), y).double().sum().cpu()
    model.train(was_training)
    return sum_(world, [total.item()])[0]


def bits_per_dim(model, x, batch_size, device, progress=False, world=World(), labels=None):
    """Exact bits/dim: total NLL in nats / (images x D x ln 2)."""
    return total_nll(model, x, batch_size, device, progress, world=world, labels=labels) / (x.numel() * LN2)
