"""Memory bounds: what a device has free, and what sampling a batch would take, checked before
the work starts so that a batch that cannot fit gets one sentence instead of a swap storm."""
import os

import torch

from .errors import UserError


def available_bytes(device):
    """Free memory of `device`: the GPU's free bytes, or the system's MemAvailable for the CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def sampling_bytes(model, batch, sampler, bytes_per_value=4):
    """Rough peak bytes of sampling `batch` images: the decoding state (linear: S and z per head;
    softmax: the K/V cache of all D positions) or, recomputing, the activations of a forward pass
    over the whole image (with the L x L scores of softmax attention), plus the per-step activations."""
    D, blocks = model.length, model.blocks
    d_model = blocks[0].attn.d_model
    d_ff = blocks[0].ff[0].weight.shape[1]
    per_position = 4 * d_model + d_ff + model.head.n_params        # one position's activations
    if sampler == "recompute":
        H = blocks[0].attn.n_heads
        scores = H * D * D if blocks[0].attn.name == "softmax" else 0
        return bytes_per_value * batch * (D * per_position * 2 + scores)
    state = 0
    for b in blocks:
        E = b.attn.head_dim
        state += b.attn.n_heads * E * (E + 1) if b.attn.name == "linear" else 2 * D * d_model
    return bytes_per_value * batch * (state + 2 * per_position)


def check_batch_fits(model, batch, sampler, device, key="batch_size"):
    """UserError when sampling `batch` images at once would take more than 80% of the free memory."""
    need, free = sampling_bytes(model, batch, sampler), 0.8 * available_bytes(device)
    if need > free:
        fits = max(1, int(batch * free / need))
        raise UserError(f"{key}={batch} would need about {need / 2**30:.1f} GiB for sampling, more than the "
                        f"{free / 2**30:.1f} GiB free; lower {key} (about {fits} fits).")
