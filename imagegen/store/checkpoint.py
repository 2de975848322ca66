"""Checkpoints: atomic save, safe load (weights_only), the model rebuilt from one, a new run's initial weights.

A checkpoint is a plain dict: {"format", "config" (JSON-able), "model" (state_dict),
plus training state when written by training: "optimizer", "state" (see runstate.RunState)}.
Everything read from a file is checked before use (checks.py: required keys and types, a model
config that fits the schema, floating-point finite weights; each failure is one sentence).
"""
import warnings
from pathlib import Path

import torch

from . import checks, shipped
from .. import files
from ..data.sets import dataset_info
from ..errors import UserError
from ..model.transformer import build_model
from ..precision import keep_out_of_int8
from .format import FORMAT, Damaged, advice


def save(path, payload):
    """Write through files.write_with (a temporary file in the same folder, fsync, rename over `path`):
    a failed write (disk full, read-only folder) leaves the previous `path` intact and raises a UserError."""
    files.write_with(path, lambda f: torch.save({"format": FORMAT, **payload}, f), "checkpoint",
                     fix="free space or fix the folder's permissions, then run the same command again to resume")


def eval_json(path, split):
    """Where imagegen-eval writes a checkpoint's result on a split (read back by the compare benchmark):
    beside the checkpoint, or in the current folder for a shipped model (the package's folder is not ours)."""
    path = shipped.resolve(path)
    name = f"{path.stem}.{split}.json"
    return Path(name) if shipped.is_shipped(path) else path.with_name(name)


def load(path, hint="checkpoint=PATH"):
    """The checked checkpoint dict at `path` (model and config; see checks.check_training for resuming):
    a .pt file of imagegen-train, a .safetensors file with its .json, or a shipped model's name.
    hint: how the command names its checkpoint option, for the sentence about a missing file. A file that
    cannot be used raises format.Damaged, which ends with what to do when it takes checkpoint=...; a
    caller that takes none gives its own step with format.advice."""
    path = shipped.resolve(path)
    checks.check_path(path, hint)
    if path.suffix == ".safetensors":
        with advice(shipped.READ_FIX):
            return checks.check(shipped.read(path), path)
    try:
        with warnings.catch_warnings():      # torch's note on a pickle protocol other than its own
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, pickle garbage, foreign objects: all unreadable to us
        reason = checks.load_reason(e) if checks.torch_saved(path) else "it is another kind of file, or damaged"
        raise Damaged(f"{path} is not a readable checkpoint (truncated or not written by imagegen: {reason})") from None
    return checks.check(ck, path)


def model_from_checkpoint(ck, path="checkpoint"):
    """Rebuild the model recorded in a loaded checkpoint and load its weights: the average of the
    weights (train.ema) when the checkpoint holds one, else the trained weights."""
    cfg = ck["config"]
    model = build_model(cfg["model"], dataset_info(cfg["data"]))
    weights = ck.get("ema", ck["model"])
    checks.check_weights_fit(weights, model, path)       # names the parameter and both shapes
    model.load_state_dict(weights)
    return keep_out_of_int8(model)             # the products an int8 run keeps out of int8


def initial_weights(spec, cfg):
    """The weights a new run starts from with train.init=SPEC (a .pt checkpoint, a .safetensors model
    or a shipped name): the checkpoint's average of the weights when it holds one. The architecture
    must be the current config's; data, training settings and dropout may differ, and model.context may
    add sub-pixel distances to those the checkpoint has (each new embedding at zero, each old one kept
    with its distance, so the first step computes what the checkpoint did)."""
    ck = load(spec, hint="train.init=PATH")
    check_same_images(spec, dataset_info(ck["config"]["data"]), dataset_info(cfg["data"]))
    then = {k: v for k, v in ck["config"]["model"].items() if k != "dropout"}
    now = {k: v for k, v in cfg["model"].items() if k != "dropout"}
    old, new = list(then.get("context") or []), list(now.get("context") or [])
    grows = set(old) < set(new)
    diffs = checks.architecture_diffs({**then, "context": new} if grows else then, now)
    if diffs:
        raise UserError(f"train.init={spec} has another architecture than this run ({'; '.join(diffs)}); "
                        f"give the model settings it was trained with (its config), or another train.init.")
    weights = dict(ck.get("ema", ck["model"]))
    if grows:        # each distance's embedding moves to its place in the new list; a new distance starts at zero
        kept = {o: weights.pop(f"ctx.{i}.weight") for i, o in enumerate(old)}
        zeros = torch.zeros(257, weights["tok.weight"].shape[1])
        weights.update({f"ctx.{i}.weight": kept.get(o, zeros).clone() for i, o in enumerate(new)})
    return weights


def check_same_images(spec, then, now):
    """train.init's model (of `then`, a DatasetInfo) takes this run's images (`now`) only at their size and
    channels; another shape is a model of other data, named as such (not a damaged file)."""
    def shape(info):
        return f"{info.height}x{info.width}, {info.channels} channel{'s' if info.channels > 1 else ''}"
    if (then.height, then.width, then.channels) != (now.height, now.width, now.channels):
        raise UserError(f"train.init={spec} is a model of {then.name} images ({shape(then)}) and this run trains on "
                        f"{now.name} ({shape(now)}); pass train.init a model of {shape(now)} images, or drop "
                        f"train.init to start from random weights.")
