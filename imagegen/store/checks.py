"""Every check of a loaded checkpoint (eval, sample, export, convert, compare and the resume of
training share them), each failure one sentence, most of the form "PATH is damaged or was edited:
WHAT; use another checkpoint ..." (`damaged`; a command that takes no checkpoint= says its own next step
instead, through format.advice):

  check(ck, path)                    a loaded dict: format tag, config, weights, buildable (checkpoint.load's)
  check_path(path, hint)             a folder or a missing file, named as such (a folder's .pt files listed)
  check_format(ck, path, current)    a newer or older format tag named as such
  torch_saved(path)                  whether the file starts as torch.save's files do
  load_reason(e)                     why torch.load refused a file, in whole words
  check_config(ck, path)             a model section that fits the schema, a known dataset
  check_tensors(state_dict, path)    a dict of floating-point tensors (nothing of them read yet)
  check_weights(state_dict, path)    ... and finite, within MAX_WEIGHT (every value read)
  check_buildable(cfg, weights, path)  before allocating: attention options, the layer count against
                                     the weights, the size against free memory
  check_shapes(cfg, weights, path)   names and shapes against the model the config describes (built on the
                                     meta device: no memory), before any value is read
  check_weights_fit(weights, model, path)  names and shapes against the built model
  check_training(ck, path)           a checkpoint to resume from holds optimizer and run state
  check_compatible(ck, cfg, path)    resuming: the same architecture, data and optimizer (notes on the rest)
  check_optimizer_fits(opt_state, optimizer, path)  groups, parameter count, moment shapes, hyperparameters
  check_run_state(state, path)       types and ranges of the run state
  check_resumable(ck, model, optimizer, path)  the last three, before a resume loads anything
"""
import math
import re
from dataclasses import fields
from pathlib import Path

import torch

from . import shipped
from .. import config
from ..data.sets import dataset_info
from ..errors import UserError
from ..tuning.machine import available_bytes
from ..dtypes import dtype_name
from .format import FORMAT, MAX_WEIGHT, damaged

MAX_STEP = 10 ** 9            # optimizer steps: far beyond any run; a larger count is an edited file
MAX_ELAPSED = 10 ** 9         # seconds trained (about 32 years)


def check_path(path, hint="checkpoint=PATH"):
    """A UserError naming a folder as a folder (with the .pt files in it), or a missing file."""
    path = Path(path)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.pt"))
        inside = (f"it holds {', '.join(found[:6])}{' ...' if len(found) > 6 else ''}; pass one of them, e.g. "
                  f"{path / found[0]}" if found else "it holds no .pt file; pass the path of a .pt file")
        raise UserError(f"checkpoint {path} is a folder, not a checkpoint file: {inside} ({hint}).")
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist; pass {hint} naming a .pt file written by imagegen-train "
                        f"or a .safetensors file, or the name of a shipped model "
                        f"({', '.join(shipped.names()) or 'none installed'}).")


def check_format(ck, path, current):
    """A dict whose format tag is another imagegen version's gets a sentence saying which."""
    tag = ck.get("format") if isinstance(ck, dict) else None
    if not isinstance(tag, str) or tag == current:
        return
    m, cur = re.fullmatch(r"imagegen/(\d+)", tag), int(current.split("/")[1])
    if m and int(m.group(1)) > cur:
        raise UserError(f"{path} was written by a newer imagegen (format {tag}; this version reads {current}); "
                        f"upgrade imagegen to read it.")
    if m:
        raise UserError(f"{path} was written by an older imagegen (format {tag}; this version reads {current}), "
                        f"whose checkpoints this version no longer reads; train again, or read it with the "
                        f"imagegen version that wrote it.")


def torch_saved(path):
    """Whether the file starts as torch.save writes: a zip archive, or a protocol 2 pickle (older torch)."""
    try:
        with open(path, "rb") as f:
            return f.read(4).startswith((b"PK\x03\x04", b"\x80\x02"))
    except OSError:                         # unreadable: torch.load's own reason says why
        return True


def load_reason(e):
    """Why torch.load refused a file, in whole words (never cut mid-word)."""
    text = str(e).strip()
    if "Weights only load failed" in text or "weights_only" in text:
        m = re.search(r"(?:unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", text, re.IGNORECASE)
        what = f"it asks to import {m.group(1)}" if m else "it holds Python objects beyond tensors and plain data"
        return f"{what}, which a safe load (weights_only) refuses to run"
    first = text.splitlines()[0] if text else type(e).__name__
    if len(first) > 120:
        first = first[:120].rsplit(" ", 1)[0].rstrip(",;:(") + " ..."
    return first


def check(ck, path):
    """The loaded dict `ck`, once its format tag, config and weights are checked."""
    check_format(ck, path, FORMAT)
    if not isinstance(ck, dict) or ck.get("format") != FORMAT or "model" not in ck or "config" not in ck:
        raise UserError(f"{path} is not an imagegen checkpoint (no '{FORMAT}' format tag); "
                        f"pass a checkpoint written by imagegen-train.")
    check_config(ck, path)
    weights = [ck["model"], *([ck["ema"]] if "ema" in ck else [])]
    for w in weights:
        check_tensors(w, path)
    check_buildable(ck["config"], ck["model"], path, available_bytes(torch.device("cpu")))
    for w in weights:           # shapes first: a tensor expanded to 10^12 values is named, never read
        check_shapes(ck["config"], w, path)
        check_weights(w, path)
    return ck


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


def check_tensors(state_dict, path):
    """A dict of floating-point tensors (their dtypes and shapes looked at, no value read)."""
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise damaged(path, "its weights are not a dict of tensors")
    for name, t in state_dict.items():
        if not t.is_floating_point():
            raise damaged(path, f"weight {name} holds {dtype_name(t.dtype)} values where floats belong")


def check_shapes(cfg, weights, path):
    """The weights' names and shapes against the model that the checkpoint's config describes, built on the
    meta device (shapes, no memory)."""
    from ..model.transformer import build_model

    info = dataset_info(cfg["data"])
    try:
        with torch.device("meta"):
            model = build_model(cfg["model"], info)
    except RuntimeError:           # a module whose constructor reads a value (FAVOR+'s draw): on the CPU,
        with torch.random.fork_rng():            # its sizes bounded by the config's checks, the RNG left as it was
            model = build_model(cfg["model"], info)
    check_weights_fit(weights, model, path)


def check_weights(state_dict, path):
    """check_tensors, and each tensor within MAX_WEIGHT. NaN or inf in a run's .pt is a run that diverged
    (a step can save what the next step's loss check would have stopped); in a .safetensors model, which
    imagegen-convert writes only from finite weights, and beyond MAX_WEIGHT anywhere, an edited file."""
    check_tensors(state_dict, path)
    for name, t in state_dict.items():
        if not torch.isfinite(t).all():
            if Path(path).suffix == ".safetensors":
                raise damaged(path, f"weight {name} holds NaN or inf, which imagegen-convert never writes")
            raise UserError(f"{path} holds non-finite weights (NaN or inf in {name}): the run diverged before this "
                            f"save; use an earlier checkpoint (best.pt) or train again with a lower train.lr.")
        if t.numel() and t.abs().max() > MAX_WEIGHT:
            raise damaged(path, f"weight {name} holds {t.abs().max().item():.3g}, out of range (beyond "
                                f"{MAX_WEIGHT:.3g}, where a weight's square overflows float32)")


def check_training(ck, path):
    """A checkpoint to resume from also holds the optimizer state and the run state."""
    opt, state = ck.get("optimizer"), ck.get("state")
    if not (isinstance(opt, dict) and isinstance(opt.get("state"), dict) and isinstance(opt.get("param_groups"), list)):
        raise damaged(path, "it holds no optimizer state to resume from")
    numbers = ("step", "elapsed", "epoch", "best_val")
    if not (isinstance(state, dict) and all(isinstance(state.get(k), (int, float)) for k in numbers)
            and state["step"] >= 0 and not math.isnan(state["elapsed"])):
        raise damaged(path, "its run state (step, elapsed, epoch) is missing or not numbers")


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


def without_impl(model_cfg):
    """A model config without attention_options.impl: which implementation computes the attention
    (C++ kernel, chunked PyTorch, Triton) is not part of the architecture, so a run may resume with another.
    The other options are filled in with their defaults, so that a checkpoint that stored only some
    ({} or {impl: auto}, as older ones did) matches a config that lists them all; no context is [] (older
    checkpoints have none)."""
    opts = config.full_attention_options(model_cfg.get("attention"), model_cfg.get("attention_options"))
    return {**model_cfg, "attention_options": {k: v for k, v in opts.items() if k != "impl"},
            "context": list(model_cfg.get("context") or [])}


def layer_count(weights):
    """The number of blocks the weights hold (distinct blocks.<i>. prefixes)."""
    return len({name.split(".")[1] for name in weights if name.startswith("blocks.") and name.count(".") >= 2})


def model_bytes(m):
    """Float32 bytes of the parameters a model config asks for (the estimate of config.check_model)."""
    d, ff = m["d_model"], m["d_ff"]
    return 4 * (m["n_layers"] * (4 * d * d + 2 * d * ff) + 300 * d)


def check_buildable(cfg, weights, path, memory_bytes=None):
    """Before the model is built from a checkpoint's config: its attention takes the options named,
    the config's layer count matches the weights', and the weights fit (twice over) in memory_bytes."""
    m = cfg["model"]
    schema = config.ATTENTION_OPTIONS.get(m["attention"])
    if schema is not None:
        takes = [f.name for f in fields(schema)]
        extra = sorted(set(m.get("attention_options") or {}) - set(takes))
        if extra:
            raise damaged(path, f"its config gives {m['attention']} attention the option(s) {', '.join(extra)}, "
                                f"which it does not take (it takes: {', '.join(takes) or 'none'})")
    held = layer_count(weights)
    if held != m["n_layers"]:
        raise damaged(path, f"its config asks for {m['n_layers']} layers but its weights hold {held}")
    need = model_bytes(m)
    if memory_bytes and 2 * need > memory_bytes:
        raise damaged(path, f"its config describes a model of about {need / 2**30:.1f} GiB of weights, more than "
                            f"the {memory_bytes / 2**30:.1f} GiB of free memory can build")


def shape(t):
    return "(" + ", ".join(map(str, t.shape)) + ")"


def check_weights_fit(weights, model, path):
    """The checkpoint's weights have the built model's names and shapes."""
    own = model.state_dict()
    missing, extra = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    wrong = [f"{k} is {shape(weights[k])} where the model needs {shape(own[k])}"
             for k in own if k in weights and weights[k].shape != own[k].shape]
    problems = ([f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"] if missing else []) + \
               ([f"unexpected {', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}"] if extra else []) + wrong[:2]
    if problems:
        raise damaged(path, f"its weights do not fit the architecture in its own config ({'; '.join(problems)})")


def number(value, low=0.0, high=math.inf):
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and low <= value <= high)


def check_optimizer_fits(opt_state, optimizer, path):
    """The checkpoint's optimizer state belongs to `optimizer`'s model: the same groups and parameter
    counts, moments of the parameters' shapes, numeric hyperparameters."""
    groups = optimizer.param_groups
    saved = opt_state["param_groups"]
    if len(saved) != len(groups):
        raise damaged(path, f"its optimizer state has {len(saved)} parameter groups where the model has "
                            f"{len(groups)}")
    params = {}
    for i, (g, s) in enumerate(zip(groups, saved)):
        if not (isinstance(s, dict) and isinstance(s.get("params"), list)):
            raise damaged(path, f"its optimizer's parameter group {i} lists no parameters")
        if len(s["params"]) != len(g["params"]):
            raise damaged(path, f"its optimizer state covers {len(s['params'])} parameters where the model has "
                                f"{len(g['params'])}: it belongs to another model")
        for key in ("lr", "weight_decay", "eps"):
            if key in s and not number(s[key]):
                raise damaged(path, f"its optimizer's {key} is {s[key]!r}, not a finite number >= 0")
        betas = s.get("betas", (0.0, 0.0))
        if not (isinstance(betas, (list, tuple)) and len(betas) == 2 and all(number(b, 0, 0.999999) for b in betas)):
            raise damaged(path, f"its optimizer's betas are {betas!r}, not two numbers in [0, 1)")
        params.update(zip(s["params"], g["params"]))
    for pid, moments in opt_state["state"].items():
        if pid not in params or not isinstance(moments, dict):
            raise damaged(path, f"its optimizer state holds moments of parameter {pid!r}, which no group lists")
        p = params[pid]
        for key, value in moments.items():
            if not isinstance(value, torch.Tensor):
                raise damaged(path, f"its optimizer's {key} of parameter {pid} is not a tensor")
            if key != "step" and value.shape != p.shape:
                raise damaged(path, f"its optimizer's {key} of parameter {pid} is {shape(value)} where the "
                                    f"parameter is {shape(p)}: it belongs to another model")
            if value.is_floating_point() and not torch.isfinite(value).all():
                raise damaged(path, f"its optimizer's {key} of parameter {pid} holds NaN or inf")


def check_run_state(state, path):
    """Types and ranges of a checkpoint's run state (see runstate.RunState)."""
    ints = {"step": MAX_STEP, "epoch": MAX_STEP, "seen": 10 ** 12}
    for key, high in ints.items():
        value = state.get(key, 0) if key == "seen" else state.get(key)
        if key == "seen" and "seen" not in state and "batch" in state:
            value = state["batch"]
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= high):
            raise damaged(path, f"its run state's {key} is {value!r}, not a whole number from 0 to {high:,}")
    if not number(state.get("elapsed"), 0, MAX_ELAPSED):
        raise damaged(path, f"its run state's elapsed is {state.get('elapsed')!r}, not a finite number of "
                            f"seconds >= 0")
    best = state.get("best_val")
    if not (isinstance(best, (int, float)) and not isinstance(best, bool) and (best == math.inf or number(best))):
        raise damaged(path, f"its run state's best_val is {best!r}, not bits/dim >= 0 (or inf before the first "
                            f"validation)")


def check_resumable(ck, model, optimizer, path):
    """Before training resumes from `ck`: weights, optimizer state and run state all fit."""
    check_weights_fit(ck["model"], model, path)
    check_optimizer_fits(ck["optimizer"], optimizer, path)
    check_run_state(ck["state"], path)
