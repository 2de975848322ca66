"""Memory bounds: what a device has free, and what sampling, scoring or training a batch would take,
checked before the work starts so that a batch that cannot fit gets one sentence instead of a swap storm
(or an allocation of hundreds of GB and a traceback)."""
import torch

from .errors import UserError
from .tuning.machine import available_bytes


def _widths(model):
    """(d_model, d_ff) of the model's blocks."""
    return model.blocks[0].attn.d_model, model.blocks[0].ff[0].weight.shape[1]


def _per_position(model):
    """One position's activations in one block (and the head's outputs), in values."""
    d_model, d_ff = _widths(model)
    return 4 * d_model + d_ff + model.head.n_params


def forward_bytes(model, batch, training=False, bytes_per_value=4):
    """Rough peak bytes of a forward pass over `batch` whole images (D positions each): scoring holds
    about two positions' worth of one block at a time (with the D x D scores of softmax attention);
    training keeps every block's activations for the backward pass, about 12 d_model + 2 d_ff values a
    position in each (measured within 15% on the CPU, 5-22% over on an H200: docs/training.md)."""
    D, blocks = model.length, model.blocks
    if training:
        d_model, d_ff = _widths(model)
        return bytes_per_value * batch * D * (len(blocks) * (12 * d_model + 2 * d_ff) + 4 * model.head.n_params)
    scores = blocks[0].attn.n_heads * D * D if blocks[0].attn.name == "softmax" else 0
    return bytes_per_value * batch * (D * _per_position(model) * 2 + scores)


def sampling_bytes(model, batch, sampler, bytes_per_value=4):
    """Rough peak bytes of sampling `batch` images: the decoding state (linear: S and z per head;
    softmax: the K/V cache of all D positions) or, recomputing, the activations of a forward pass
    over the whole image (`forward_bytes`), plus the per-step activations."""
    if sampler == "recompute":
        return forward_bytes(model, batch, bytes_per_value=bytes_per_value)
    D, blocks, per_position = model.length, model.blocks, _per_position(model)
    d_model = blocks[0].attn.d_model
    state = 0
    for b in blocks:
        E = b.attn.head_dim
        state += b.attn.n_heads * E * (E + 1) if b.attn.name == "linear" else 2 * D * d_model
    return bytes_per_value * batch * (state + 2 * per_position)


def _check_fits(need, batch, device, key, work, asked=None):
    """asked: the key's value when more than the batch it runs at (batch: at most the images there are)."""
    free = 0.8 * available_bytes(torch.device(device))
    if need > free:
        fits = max(1, int(batch * free / need))
        value = f"{asked} ({batch} images at once)" if asked and asked != batch else batch
        raise UserError(f"{key}={value} would need about {need / 2**30:.1f} GiB for {work}, more than the "
                        f"{free / 2**30:.1f} GiB free; lower {key} (about {fits} fits).")


def check_batch_fits(model, batch, sampler, device, key="batch_size", asked=None):
    """UserError when sampling `batch` images at once would take more than 80% of the free memory."""
    _check_fits(sampling_bytes(model, batch, sampler), batch, device, key, "sampling", asked)


def check_forward_fits(model, batch, device, key="batch_size", training=False, bytes_per_value=4, asked=None):
    """UserError when scoring (or, training=True, training on) `batch` images at once would take more
    than 80% of the free memory of `device` (bytes_per_value 2: bfloat16 activations)."""
    need = forward_bytes(model, batch, training, bytes_per_value)
    _check_fits(need, batch, device, key, "training" if training else "scoring the images", asked)


def sampling_batch(model, batch_size, n, sampler, device):
    """The batch that sampling n images batch_size at a time runs at, min(batch_size, n), checked to fit:
    before anything measures or allocates at batch_size (batch_size=1000000000 for 2 images was timed at
    that size by precision=auto: 512 GB)."""
    batch = min(batch_size, n)
    check_batch_fits(model, batch, sampler, device, asked=batch_size)
    return batch


def output_bytes(info, images, tiles, nrow, scale, prefix=0, pad=2):
    """Rough peak bytes of a sampling request's outputs on the CPU: the sampled (images, D) uint8
    sequences (and the completion prefixes, `prefix` sub-pixels each), the tiles laid out for the
    grid, and the grid itself (canvas, PIL copy, upscaled copy)."""
    D = info.length
    laid_out = 2 * tiles * D if tiles != images else 0             # completion rows: copies and concatenation
    return 2 * images * D + images * prefix + laid_out + grid_bytes(info, tiles, nrow, scale, pad)


def grid_bytes(info, tiles, nrow, scale, pad=2):
    """Rough peak bytes of a grid of `tiles` images, nrow per row (sampling.decode.grid): the canvas, its
    PIL copy and the copy upscaled `scale` times."""
    ncol = min(nrow, tiles)
    rows = -(-tiles // ncol)
    canvas = (rows * (info.height + pad) + pad) * (ncol * (info.width + pad) + pad) * info.channels
    return canvas * (2 + scale * scale)


def check_grid_fits(info, tiles, nrow, scale):
    """UserError, before the canvas is allocated, when a grid of `tiles` images at `scale` would take more
    than 80% of the free CPU memory; it names the largest scale that fits."""
    need, free = grid_bytes(info, tiles, nrow, scale), 0.8 * available_bytes(torch.device("cpu"))
    if need > free:
        fits = int(max(0.0, free / grid_bytes(info, tiles, nrow, 1) * 3 - 2) ** 0.5)   # (2 + s^2) / 3 of scale 1's
        raise UserError(f"a grid of {tiles:,} images at scale={scale:,} would need about {need / 2**30:.1f} GiB, "
                        f"more than the {free / 2**30:.1f} GiB of free memory; lower scale (at most about {fits:,} "
                        f"fits) or tile fewer images.")


def check_images_fit(info, images, asked):
    """UserError, before the first batch, when `images` sampled images (with their prefixes: twice D bytes
    each) would take more than 80% of the free CPU memory; asked: the request in words ("n=1,000,000")."""
    need, free = 2 * images * info.length, 0.8 * available_bytes(torch.device("cpu"))
    if need > free:
        raise UserError(f"{asked} would need about {need / 2**30:.1f} GiB for {images:,} images, more than the "
                        f"{free / 2**30:.1f} GiB of free memory; ask for fewer (at most about "
                        f"{int(images * free / need):,} fit).")


def check_request_fits(cfg, info, key="num_images", label_rows=0):
    """UserError, before the first batch, when the outputs of an imagegen-sample request (cfg: its
    config) would take more than 80% of the free CPU memory; it names the largest request that fits.
    label_rows: in grid mode, the classes that each get a row of nrow images (labels=auto or a list),
    which are then drawn instead of num_images."""
    if cfg.mode == "complete":
        images, k = cfg.num_originals * cfg.completions, cfg.completions
        tiles, nrow, prefix = cfg.num_originals * (k + 2), k + 2, info.length // 2
        asked = f"num_originals={cfg.num_originals} x completions={k} = {images:,} completions"
    elif label_rows:
        images = tiles = label_rows * cfg.nrow
        nrow, prefix, asked = cfg.nrow, 0, f"nrow={cfg.nrow:,} images for each of {label_rows} label rows"
    else:
        images = tiles = cfg.num_images
        nrow, prefix, asked = cfg.nrow, 0, f"{key}={images:,} images"
    need = output_bytes(info, images, tiles, nrow, cfg.scale, prefix)
    free = 0.8 * available_bytes(torch.device("cpu"))
    if need <= free:
        return
    fits = max(0, int(images * free / need))
    if fits < max(1, label_rows) and cfg.scale > 1:  # not one image (one row each) at this scale: name the scale
        low, high = 1, cfg.scale
        while low < high:                               # the largest scale at which the request fits
            mid = (low + high + 1) // 2
            low, high = (mid, high) if output_bytes(info, images, tiles, nrow, mid, prefix) <= free else (low, mid - 1)
        if output_bytes(info, images, tiles, nrow, low, prefix) <= free:
            raise UserError(f"{asked} at scale={cfg.scale:,} would need about {need / 2**30:.1f} GiB for the "
                            f"grid, more than the {free / 2**30:.1f} GiB of free memory; lower the scale (at most "
                            f"about scale={low:,} fits).")
    if cfg.mode == "complete":
        hint = (f"at most about {fits:,} completions fit, e.g. num_originals={max(1, fits // k):,} with "
                f"completions={k}" if fits >= k else f"at most about {fits:,} completions fit")
    elif label_rows:
        hint = f"at most about nrow={max(1, fits // label_rows):,} fits at scale={cfg.scale}"
    else:
        hint = f"at most about {fits:,} fit at scale={cfg.scale}"
    raise UserError(f"{asked} would need about {need / 2**30:.1f} GiB for the images and the grid, more than the "
                    f"{free / 2**30:.1f} GiB of free memory; ask for fewer ({hint}), or a lower scale.")
