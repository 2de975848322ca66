"""Checkpoints: atomic save, safe load (weights_only), checked contents, config round-trip.

A checkpoint is a plain dict: {"format", "config" (JSON-able), "model" (state_dict),
plus training state when written by training: "optimizer", "state" (see runstate.RunState)}.
Everything read from a file is checked before use: required keys and types, a model config
that fits the schema, floating-point finite weights; each failure is one sentence.
"""
import math
import warnings
from pathlib import Path

import torch

from . import checks as checks, shipped
from .. import files
from ..data.sets import dataset_info
from ..errors import UserError
from ..memory import available_bytes
from ..model.transformer import build_model
from ..precision import dtype_name

FORMAT = "imagegen/1"


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
    """The checked checkpoint dict at `path` (model and config; see `check_training` for resuming):
    a .pt file of imagegen-train, a .safetensors file with its .json, or a shipped model's name.
    hint: how the command names its checkpoint option, for the sentence about a missing file."""
    path = shipped.resolve(path)
    checks.check_path(path, hint)
    if path.suffix == ".safetensors":
        return check(shipped.read(path), path)
    try:
        with warnings.catch_warnings():      # torch's note on a pickle protocol other than its own
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, pickle garbage, foreign objects: all unreadable to us
        reason = checks.load_reason(e) if checks.torch_saved(path) else "it is another kind of file, or damaged"
        raise UserError(f"{path} is not a readable checkpoint (truncated or not written by imagegen: {reason}); "
                        f"use another checkpoint, e.g. best.pt or last.pt from the run folder.") from None
    return check(ck, path)


def check(ck, path):
    """The loaded dict `ck`, once its format tag, config and weights are checked."""
    checks.check_format(ck, path, FORMAT)
    if not isinstance(ck, dict) or ck.get("format") != FORMAT or "model" not in ck or "config" not in ck:
        raise UserError(f"{path} is not an imagegen checkpoint (no '{FORMAT}' format tag); "
                        f"pass a checkpoint written by imagegen-train.")
    check_config(ck, path)
    check_weights(ck["model"], path)
    if "ema" in ck:
        check_weights(ck["ema"], path)
    checks.check_buildable(ck["config"], ck["model"], path, available_bytes(torch.device("cpu")))
    return ck


def damaged(path, what):
    return UserError(f"{path} is damaged or was edited: {what}; use another checkpoint, e.g. best.pt or last.pt "
                     f"from the run folder.")


def check_config(ck, path):
    """The stored config has a model section that fits the schema and a known dataset."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from ..config import ModelConfig, check_model

    cfg = ck["config"]
    if not (isinstance(cfg, dict) and isinstance(cfg.get("model"), dict) and isinstance(cfg.get("data"), dict)
            and isinstance(cfg["data"].get("name"), str)):
        raise damaged(path, "its config lacks the model or data section")
    try:
        model = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg["model"]))
    except OmegaConfBaseException as e:
        raise damaged(path, f"its model config does not fit ({str(e).splitlines()[0]})") from None
    try:
        check_model(model)
        dataset_info(cfg["data"])
    except UserError as e:
        raise damaged(path, str(e).rstrip(".")) from None
    cfg["model"] = model


def check_weights(state_dict, path):
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise damaged(path, "its weights are not a dict of tensors")
    for name, t in state_dict.items():
        if not t.is_floating_point():
            raise damaged(path, f"weight {name} holds {dtype_name(t.dtype)} values where floats belong")
        if not torch.isfinite(t).all():
            raise UserError(f"{path} holds non-finite weights (NaN or inf in {name}): the run diverged before this "
                            f"save; use an earlier checkpoint (best.pt) or train again with a lower train.lr.")


def check_training(ck, path):
    """A checkpoint to resume from also holds the optimizer state and the run state."""
    opt, state = ck.get("optimizer"), ck.get("state")
    if not (isinstance(opt, dict) and isinstance(opt.get("state"), dict) and isinstance(opt.get("param_groups"), list)):
        raise damaged(path, "it holds no optimizer state to resume from")
    numbers = ("step", "elapsed", "epoch", "best_val")
    if not (isinstance(state, dict) and all(isinstance(state.get(k), (int, float)) for k in numbers)
            and state["step"] >= 0 and not math.isnan(state["elapsed"])):
        raise damaged(path, "its run state (step, elapsed, epoch) is missing or not numbers")


def model_from_checkpoint(ck, path="checkpoint"):
    """Rebuild the model recorded in a loaded checkpoint and load its weights: the average of the
    weights (train.ema) when the checkpoint holds one, else the trained weights."""
    cfg = ck["config"]
    model = build_model(cfg["model"], dataset_info(cfg["data"]))
    weights = ck.get("ema", ck["model"])
    checks.check_weights_fit(weights, model, path)       # names the parameter and both shapes
    model.load_state_dict(weights)
    return model


def check_compatible(ck, cfg, path):
    """Resuming: the checkpoint's model, data and optimizer must match the current config; other
    training settings may change, and the returned notes say which did."""
    diffs = architecture_diffs(ck["config"]["model"], cfg["model"])
    if ck["config"]["data"]["name"] != cfg["data"]["name"]:
        diffs.append(f"data: {ck['config']['data']['name']} in checkpoint vs {cfg['data']['name']} now")
    if diffs:
        raise UserError(f"{path} was trained with a different architecture ({'; '.join(diffs)}); "
                        f"use another run_dir=... or the checkpoint's settings, or train.resume=false to start over.")
    old = ck["config"].get("train", {})
    if old.get("optimizer", cfg["train"]["optimizer"]) != cfg["train"]["optimizer"]:
        raise UserError(f"{path} holds {old['optimizer']} optimizer state but "
                        f"train.optimizer={cfg['train']['optimizer']} "
                        f"now; resume with train.optimizer={old['optimizer']}, or start over with train.resume=false "
                        f"or another run_dir.")
    impl = [(ck["config"]["model"].get("attention_options") or {}).get("impl", "auto"),
            (cfg["model"].get("attention_options") or {}).get("impl", "auto")]
    return ([f"model.attention_options.impl: {impl[0]!r} -> {impl[1]!r}"] if impl[0] != impl[1] else []) + [
        f"train.{k}: {old[k]!r} -> {v!r}" for k, v in cfg["train"].items()
        if k in old and old[k] != v and k not in ("resume", "progress")]


def architecture_diffs(then, now):
    """['model.KEY: OLD in checkpoint vs NEW now'] for each architecture setting that differs
    (which implementation computes the attention is not one)."""
    then, now = without_impl(then), without_impl(now)
    return [f"model.{k}: {then.get(k)!r} in checkpoint vs {v!r} now" for k, v in now.items() if then.get(k) != v]


def initial_weights(spec, cfg):
    """The weights a new run starts from with train.init=SPEC (a .pt checkpoint, a .safetensors model
    or a shipped name): the checkpoint's average of the weights when it holds one. The architecture
    must be the current config's; data, training settings and dropout may differ."""
    ck = load(spec, hint="train.init=PATH")
    model = {k: v for k, v in cfg["model"].items() if k != "dropout"}
    diffs = architecture_diffs({k: v for k, v in ck["config"]["model"].items() if k != "dropout"}, model)
    if diffs:
        raise UserError(f"train.init={spec} has another architecture than this run ({'; '.join(diffs)}); "
                        f"give the model settings it was trained with (its config), or another train.init.")
    return ck.get("ema", ck["model"])


def without_impl(model_cfg):
    """A model config without attention_options.impl: which implementation computes the attention
    (C++ kernel, chunked PyTorch, Triton) is not part of the architecture, so a run may resume with another."""
    opts = {k: v for k, v in (model_cfg.get("attention_options") or {}).items() if k != "impl"}
    return {**model_cfg, "attention_options": opts}
