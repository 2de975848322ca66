"""Checkpoints: atomic save, safe load (weights_only), config round-trip.

A checkpoint is a plain dict: {"format", "config" (JSON-able), "model" (state_dict),
plus training state when written by training: "optimizer", "step", "elapsed", ...}.
"""
import os
from pathlib import Path

import torch

from .data import dataset_info
from .errors import UserError
from .model import build_model

FORMAT = "imagegen/1"


def save(path, payload):
    """Write to a temporary file in the same folder, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save({"format": FORMAT, **payload}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load(path):
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist; pass checkpoint=PATH to a .pt file written by imagegen-train.")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, pickle garbage, foreign objects: all unreadable to us
        reason = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
        raise UserError(f"{path} is not a readable checkpoint (truncated or not written by imagegen: {reason}); "
                        f"use another checkpoint, e.g. best.pt or last.pt from the run folder.") from None
    if not isinstance(ck, dict) or ck.get("format") != FORMAT or "model" not in ck or "config" not in ck:
        raise UserError(f"{path} is a PyTorch file but not an imagegen checkpoint (no '{FORMAT}' format tag); "
                        f"pass a checkpoint written by imagegen-train.")
    return ck


def model_from_checkpoint(ck, path="checkpoint"):
    """Rebuild the model recorded in a loaded checkpoint and load its weights."""
    cfg = ck["config"]
    model = build_model(cfg["model"], dataset_info(cfg["data"]["name"]))
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as e:
        first = str(e).splitlines()[0]
        raise UserError(f"{path} holds weights that do not fit the architecture in its own config ({first}); "
                        f"the file is damaged or was edited, use another checkpoint.") from None
    return model


def check_compatible(ck, cfg, path):
    """Resuming: the checkpoint's model and data must match the current config."""
    diffs = [f"model.{k}: {ck['config']['model'].get(k)!r} in checkpoint vs {v!r} now"
             for k, v in cfg["model"].items() if ck["config"]["model"].get(k) != v]
    if ck["config"]["data"]["name"] != cfg["data"]["name"]:
        diffs.append(f"data: {ck['config']['data']['name']} in checkpoint vs {cfg['data']['name']} now")
    if diffs:
        raise UserError(f"{path} was trained with a different architecture ({'; '.join(diffs)}); "
                        f"use another run_dir=... or the checkpoint's settings, or train.resume=false to start over.")
