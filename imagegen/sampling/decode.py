"""Decoding loops over the attention protocol, completions, and image grids.

- `step` loop: one `model.step` per sub-pixel. For linear attention this is the RNN
  (state S, Z per layer, constant work per step); for softmax it is a preallocated
  KV cache written in place. Available when `model.can_step`. On CUDA, linear models run
  it as a replayed CUDA graph (`cuda_graph_step`).
- `recompute` loop: the whole prefix through `model.forward` at every step: the paper's
  softmax baseline and the only way to sample LSH.
Both draw one uniform per image per sampled position from the same generator, so with
one seed they produce the same images from the same model.
Class-conditional models take labels (N,), one per image (-1 or None: no label). With
classifier-free guidance G != 1 each loop runs the conditional and the unconditional branch
side by side as one batch of 2N (the RNN: two states per image) and draws from
the bounded guided distribution of `model.heads.guided_probs`.
`dtype` (precision=bfloat16): the step loop runs the blocks' products in bfloat16 with weights
converted once into the decoding state (see `PixelTransformer.init_state`); the recompute loop
runs model.forward under bfloat16 autocast. `dtype` dtypes.INT8 (precision=int8, CPU): every Dense
product in int8 (8-bit weights quantized once, activations per row; `ops.int8`): the step loop through
the one-call C++ step where the kernel's int8 product runs (else the Python module loop), the recompute
loop's forward inside `ops.dense.int8_weights`. Distribution parameters and the draw stay float32.
"""
from contextlib import nullcontext

import math

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from tqdm import tqdm

from ..config import check_sampling
from ..errors import UserError
from ..model.heads import sample as draw
from ..memory import check_batch_fits
from ..dtypes import INT8
from ..ops.dense import int8_weights
from ..precision import keep_out_of_int8
from ..model.transformer import START
from ..dtypes import autocast
from .plan import make_step

SAMPLERS = ("auto", "step", "recompute")


def resolve_sampler(model, sampler):
    if sampler not in SAMPLERS:
        raise UserError(f"unknown sampler {sampler!r}; choose one of {', '.join(SAMPLERS)}.")
    if sampler == "auto":
        return "step" if model.can_step else "recompute"
    if sampler == "step" and not model.can_step:
        raise UserError("this model's attention (LSH) cannot step; use sampler=recompute or sampler=auto.")
    return sampler


def sampler_label(model, sampler):
    """What the loop amounts to for this model: recurrent (linear), kv-cache (softmax) or recompute."""
    if sampler == "recompute":
        return "recompute"
    return "recurrent" if model.blocks[0].attn.name == "linear" else "kv-cache"


def draw_step(model, token, state, temperature, generator, uniforms=None):
    """One step of the step loop: parameters for position state['t'] from the previous byte
    `token` (N,) long, then a draw (from `uniforms` (N,) if given). Returns (bytes (N,) uint8, state)."""
    params, state = model.step(token, state)
    return draw(model.head, params, temperature, generator, uniforms), state


def guided(model, labels, guidance):
    """Whether sampling runs the unconditional branch beside the conditional one."""
    return bool(model.num_classes) and labels is not None and guidance != 1.0


def branches(labels, guide):
    """The labels of the batch the model runs: labels (N,), or [labels, no label] (2N,) when guided."""
    return torch.cat([labels, torch.full_like(labels, -1)]) if guide else labels


def split_draw(model, params, n, guide, temperature, generator, uniforms=None, guidance=1.0):
    """Draw n bytes from params (n, P), or from the guided pair in params (2n, P)."""
    cond, uncond = (params[:n], params[n:]) if guide else (params, None)
    return draw(model.head, cond, temperature, generator, uniforms, uncond, guidance)


def recompute_step(model, x, t, temperature, generator, dtype=None, labels=None, guidance=1.0):
    """One step of the recompute loop: the prefix x[:, :t] through model.forward (bfloat16 autocast
    for dtype=bfloat16, int8 Dense products for dtypes.INT8), then a draw for x[:, t]."""
    guide = guided(model, labels, guidance)
    prefix = x[:, :t + 1].repeat(2, 1) if guide else x[:, :t + 1]
    with autocast(x.device, dtype == torch.bfloat16), int8_forward(model, dtype):
        params = model(prefix, branches(labels, guide))[:, t]
    return split_draw(model, params.float(), len(x), guide, temperature, generator, guidance=guidance)


@torch.inference_mode()
def fill_step(model, x, start, temperature, generator, on_step=None, dtype=None, uniforms=None, labels=None,
              guidance=1.0):
    """Sample x[:, start:] in place with model.step; x[:, :start] is the given prefix (N, D) uint8.
    dtype: the products' (None: the parameters'); uniforms (N, D), if given, are the draws:
    uniforms[:, t] for position t; labels (N,) long or None, guidance: see the module docstring."""
    N, D = x.shape
    guide = guided(model, labels, guidance)
    run_labels = branches(labels, guide)
    step = make_step(model, 2 * N if guide else N, x.device, dtype, run_labels)   # CUDA: one graph replay per step
    token = torch.full((N,), START, dtype=torch.long, device=x.device)
    for t in range(D):
        params = step(token.repeat(2) if guide else token)
        if t >= start:                     # the prefix only feeds the state
            x[:, t] = split_draw(model, params, N, guide, temperature, generator,
                                 None if uniforms is None else uniforms[:, t], guidance)
        token = x[:, t].long()
        if on_step:
            on_step(t)
    return x


@torch.inference_mode()
def fill_recompute(model, x, start, temperature, generator, on_step=None, dtype=None, labels=None, guidance=1.0):
    """Sample x[:, start:] in place, recomputing the prefix with model.forward at every step."""
    with int8_forward(model, dtype):                 # int8: the weights quantized once for every step
        for t in range(start, x.shape[1]):
            x[:, t] = recompute_step(model, x, t, temperature, generator, dtype, labels, guidance)
            if on_step:
                on_step(t)
    return x


def int8_forward(model, dtype):
    """A context running model.forward's Dense products in int8 for dtype dtypes.INT8, else a no-op."""
    return int8_weights(keep_out_of_int8(model)) if dtype == INT8 else nullcontext()


def check_labels(model, labels, n):
    """labels as (n,) long (None stays None) for a model that takes them; one sentence otherwise."""
    if labels is None:
        return None
    if not model.num_classes:
        raise UserError("this model is unconditional (trained without labels); leave out label=/labels=, or "
                        "train with model.num_classes=10.")
    labels = torch.as_tensor(labels, dtype=torch.long).flatten()
    if len(labels) == 1:
        labels = labels.expand(n)
    if len(labels) != n or bool(((labels < -1) | (labels >= model.num_classes)).any()):
        raise UserError(f"labels must be one class number or {n} of them, each in 0..{model.num_classes - 1} "
                        f"(-1: none); got {labels.tolist()[:20]}.")
    return labels


def generate(model, n, *, sampler="auto", temperature=1.0, seed=0, batch_size=64, prefix=None,
             progress=False, desc="sampling", dtype=None, uniforms=None, labels=None, guidance=1.0):
    """n images as (n, D) uint8. prefix (n, P) uint8, if given, is kept and the rest sampled.
    labels: one class or n of them (-1: none) for a class-conditional model; guidance: see the module docstring.
    dtype: None (the parameters'), float32, bfloat16 or dtypes.INT8: the matrix products' (see the module
    docstring).
    uniforms (n, D) in [0, 1), if given, replace the seeded draws (step sampler only): image i
    at position t takes uniforms[i, t], which lets another implementation reproduce the bytes."""
    check_sampling(batch_size=batch_size, temperature=temperature, guidance=guidance)
    model.eval()
    sampler = resolve_sampler(model, sampler)
    device = next(model.parameters()).device
    D = model.length
    start = 0 if prefix is None else prefix.shape[1]
    if prefix is not None and (prefix.shape[0] != n or start > D):
        raise UserError(f"prefix of shape {tuple(prefix.shape)} does not fit {n} images of {D} sub-pixels.")
    labels = check_labels(model, labels, n)
    if labels is not None:
        labels = labels.to(device)
    check_batch_fits(model, min(batch_size, n) * (2 if guided(model, labels, guidance) else 1), sampler, device)
    if uniforms is not None and (sampler != "step" or tuple(uniforms.shape) != (n, D)):
        raise UserError(f"explicit uniforms need the step sampler and shape ({n}, {D}), "
                        f"got {sampler} and {tuple(uniforms.shape)}.")
    generator = torch.Generator(device=device).manual_seed(seed)
    fill = fill_step if sampler == "step" else fill_recompute
    out = torch.zeros(n, D, dtype=torch.uint8, device=device)
    if prefix is not None:
        out[:, :start] = prefix.to(device)
    row = model.width * model.channels                              # sub-pixels per image row
    bar = tqdm(total=math.ceil(n / batch_size) * math.ceil((D - start) / row), unit="row", desc=desc,
               disable=not progress, leave=False)

    def on_step(t):
        if t >= start and (t + 1 - start) % row == 0 or t == D - 1:
            bar.update(1)

    for i in range(0, n, batch_size):
        extra = {} if uniforms is None else {"uniforms": uniforms[i:i + batch_size]}
        fill(model, out[i:i + batch_size], start, temperature, generator, on_step, dtype,
             labels=None if labels is None else labels[i:i + batch_size], guidance=guidance, **extra)
    bar.close()
    return out.cpu()


# ---------------------------------------------------------------- pictures
def to_images(seq, info):
    """(B, D) uint8 -> (B, H, W, C) numpy uint8."""
    return seq.reshape(-1, info.height, info.width, info.channels).numpy()


def grid(images, nrow=8, scale=1, pad=2, background=255):
    """Tile (B, H, W, C) uint8 into one PIL image, nrow images per row, nearest-neighbour upscaled."""
    B, H, W, C = images.shape
    ncol = min(nrow, B)
    rows = math.ceil(B / ncol)
    canvas = np.full((rows * (H + pad) + pad, ncol * (W + pad) + pad, C), background, np.uint8)
    for i, img in enumerate(images):
        r, c = divmod(i, ncol)
        canvas[pad + r * (H + pad): pad + r * (H + pad) + H, pad + c * (W + pad): pad + c * (W + pad) + W] = img
    pil = Image.fromarray(canvas[..., 0] if C == 1 else canvas)
    return pil.resize((pil.width * scale, pil.height * scale), Image.NEAREST) if scale > 1 else pil


def name_rows(image, names, background=255):
    """A grid (PIL) of len(names) rows with a margin on its left holding each row's name, centred on the row."""
    size = max(10, min(24, image.height // len(names) // 2))
    try:
        font = ImageFont.load_default(size=size)
    except (TypeError, OSError):                      # Pillow without FreeType: the fixed bitmap font
        font = ImageFont.load_default()
    draw = ImageDraw.Draw(image)
    margin = int(max(draw.textlength(n, font=font) for n in names)) + size
    grey = image.mode == "L"
    out = Image.new(image.mode, (image.width + margin, image.height), background if grey else (background,) * 3)
    out.paste(image, (margin, 0))
    draw, ink = ImageDraw.Draw(out), 0 if grey else (0, 0, 0)
    for r, name in enumerate(names):
        draw.text((margin - size // 2, (r + 0.5) * image.height / len(names)), name, fill=ink, font=font, anchor="rm")
    return out


def completion_rows(originals, completions, keep):
    """Rows of [occluded input, completions..., original] as (rows * (k + 2), H, W, C).

    originals (R, H, W, C); completions (R, k, H, W, C); keep: image rows kept on top."""
    occluded = originals.copy()
    occluded[:, keep:] = 128      # the hidden half shown as flat grey
    rows = [np.concatenate([occluded[i:i + 1], completions[i], originals[i:i + 1]]) for i in range(len(originals))]
    return np.concatenate(rows)
