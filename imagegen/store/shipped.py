"""Models in the shippable form: weights as .safetensors (no pickle, nothing in them can run) beside
a JSON file holding the config, found by path or by name (checkpoint=mnist-linear) among the models
that ship in the package's checkpoints/ folder.

  NAME.safetensors   the weights (the average of the weights when the run kept one), float32; converted
                     with precision=int8, each Dense layer's weight X.weight as int8 beside its float32
                     scales X.weight_scale (one per output column), which `read` turns back into float32
  NAME.json          {"format": "imagegen/1", "weights_sha256": "<hex>", "config": {"model", "data", "train"},
                     "record": {...}}; `read` refuses weights whose sha256 is not the recorded one (a
                     .json of an older imagegen, without it, is read as it is)
  NAME.md            the model card: how it was trained and what it scores (shipped models)

`read` gives the same dict as a .pt checkpoint's {"format", "config", "model"} (plus "record"),
so every command checks and loads either the same way (checkpoint.load). The run checkpoints
(.pt) stay the form to resume from: they also hold the optimizer and the run state.
"""
import json
import os
from pathlib import Path

from ..errors import UserError
from ..files import read_json
from ..paths import data_dir
from .format import FORMAT, MAX_WEIGHT, damaged

SHIPPED = data_dir("checkpoints")
DEFAULT = "mnist-linear"          # what imagegen-sample draws from when no checkpoint is named
MAX_CONFIG_BYTES = 1 << 20
READ_FIX = "convert the run's best.pt again with imagegen-convert, or use another checkpoint"  # a .safetensors unread


def names():
    """The names of the models that ship with this installation."""
    return sorted(p.stem for p in SHIPPED.glob("*.safetensors"))


def resolve(spec):
    """The file a checkpoint= value names: an existing path, else a shipped model's weights."""
    path = Path(str(spec)).expanduser()
    if path.exists() or "/" in str(spec) or os.sep in str(spec):
        return path
    named = SHIPPED / f"{spec}.safetensors"
    return named if named.is_file() else path


def is_shipped(path):
    """Whether path is one of the package's shipped models (whose folder may be read-only)."""
    return Path(path).resolve().parent == SHIPPED.resolve()


def default_root(dataset):
    """Where a dataset is looked for when a config leaves data.root empty: $IMAGEGEN_DATA/<name> or data/<name>."""
    return str(Path(os.environ.get("IMAGEGEN_DATA", "data")).expanduser() / dataset)


def read(path):
    """{"format", "config", "model" (state_dict), "record"} of the .safetensors file `path` and its .json."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    config_path = path.with_suffix(".json")
    fix = f"{READ_FIX}."
    if not config_path.is_file():
        raise UserError(f"{path} has no config beside it ({config_path.name} is missing); {fix}")
    meta = read_json(config_path, MAX_CONFIG_BYTES, "config", fix)
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise UserError(f"{config_path} holds no config section; {fix}")
    try:
        weights = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise UserError(f"{path} is not a readable .safetensors file (damaged or truncated: {reason}); {fix}") from None
    weights = dequantized(weights, path)
    from ..files import sha256
    if "weights_sha256" in meta and meta["weights_sha256"] != sha256(path):
        raise UserError(f"{path} does not match the weights_sha256 recorded in {config_path.name} (damaged or "
                        f"altered since imagegen-convert wrote it); reinstall imagegen for a shipped model, else {fix}")
    record = meta.get("record", {})
    guidance = record.get("guidance", 1.0) if isinstance(record, dict) else None
    if not isinstance(guidance, (int, float)) or isinstance(guidance, bool) or not 0 <= guidance < float("inf"):
        raise UserError(f"{config_path} records no usable guidance (a number >= 0 under \"record\"); {fix}")
    config = meta["config"]
    data = config.get("data")
    if isinstance(data, dict) and data.get("root") is None and isinstance(data.get("name"), str):
        data["root"] = default_root(data["name"])
    return {"format": meta.get("format"), "config": config, "model": weights, "record": record}


def shippable_config(config, data=None):
    """A run's config as a shipped model keeps it: the architecture and the training settings, with
    the attention impl left to the machine that loads it (auto). data: the data section to record
    (imagegen-convert: the checkpoint's, its root included, under the command line's data.* values);
    None leaves the data root empty (read() then looks in $IMAGEGEN_DATA/<name> or data/<name>)."""
    model = {**config["model"], "attention_options": {**config["model"].get("attention_options", {})}}
    if "impl" in model["attention_options"]:
        model["attention_options"]["impl"] = "auto"
    data = {**config["data"], "root": None} if data is None else dict(data)
    train = dict(config.get("train", {}))
    if train.get("init") and Path(train["init"]).is_absolute():     # not the path of the machine that trained it
        train["init"] = run_file(Path(train["init"]))
    return {"model": model, "data": data, "train": train}


def run_file(path):
    """A checkpoint's run folder and file name (runs/a/best.pt -> a/best.pt): what a shipped record names."""
    return f"{path.parent.name}/{path.name}"


WRITE_FIX = "free space or choose another out=..."
PRECISIONS = ("float32", "int8")
SCALE = "_scale"            # X.weight (int8) lies beside X.weight_scale (float32)


def check_precision(precision):
    """precision=float32|int8 of imagegen-convert and imagegen-export, else one sentence."""
    if precision not in PRECISIONS:
        raise UserError(f"precision must be float32 or int8 (int8: each Dense layer's weight in 8 bits with a "
                        f"float32 scale per output column), got {precision!r}.")
    return precision


def int8_state(model):
    """model's state dict with each Dense layer's weight X.weight as int8 and its float32 scales
    X.weight_scale (ops.int8.quantize_columns: the one rounding rule); the rest as it is."""
    from ..ops.dense import Dense
    from ..ops.int8 import quantize_columns

    state = dict(model.state_dict())
    for name, module in model.named_modules():
        if isinstance(module, Dense):
            key = f"{name}.weight"
            state[key], state[key + SCALE] = quantize_columns(module.weight)
    return state


def dequantized(weights, path):
    """weights (a state dict as read) with each int8 X.weight and its X.weight_scale replaced by float32
    X.weight = q * scale; a UserError naming what does not fit (`check_int8`)."""
    import torch

    check_int8(weights, path)
    return {name: t.float() * weights[name + SCALE] if t.dtype == torch.int8 else t
            for name, t in weights.items() if not name.endswith(".weight" + SCALE)}


def weights_bytes(state_dict):
    """The .safetensors bytes of a state dict (float32, int8 tensors kept int8, contiguous, on the CPU)."""
    import torch
    from safetensors.torch import save

    return save({k: (v if v.dtype == torch.int8 else v.to(torch.float32)).detach().contiguous().cpu()
                 for k, v in state_dict.items()})


def check_writable(stem, overwrite=False):
    """Refuse (one sentence, nothing written) a STEM that names a shipped model of the package, or whose
    STEM.safetensors or STEM.json imagegen did not write there (or which changed since) unless `overwrite`
    (files.write_owned's rule)."""
    from ..files import check_owned

    path = Path(stem).with_suffix(".safetensors")
    if is_shipped(path) and (path.exists() or path.with_suffix(".json").exists()):
        raise UserError(f"{path.with_suffix('')} is a model shipped with imagegen, which is never replaced; choose "
                        f"another out=..., e.g. out={Path.cwd() / (path.stem + '-mine')} (nothing was written).")
    check_owned([path, path.with_suffix(".json")], "model", overwrite)


def write(stem, config, weights, record, overwrite=False):
    """Write STEM.safetensors (weights: a state dict or weights_bytes' bytes) and STEM.json (config:
    shippable_config's, recorded as given), each atomically through files.write_owned (refused as
    check_writable refuses); returns the two paths. When the .json cannot be written, the .safetensors
    written just before is removed: a failed write leaves no half model behind."""
    from ..files import write_owned

    check_writable(stem, overwrite)
    path = Path(stem).with_suffix(".safetensors")
    blob = weights if isinstance(weights, bytes) else weights_bytes(weights)
    write_owned(path, blob, "weights", overwrite, WRITE_FIX)
    try:
        return path, write_config(stem, config, record, overwrite)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def write_config(stem, config, record, overwrite=False):
    """Write STEM.json alone (a shippable_config, the record and the sha256 of the STEM.safetensors written
    before it) through files.write_owned; returns its path."""
    from ..files import sha256, write_owned

    meta = Path(stem).with_suffix(".json")
    digest = sha256(Path(stem).with_suffix(".safetensors"))
    text = json.dumps({"format": FORMAT, "weights_sha256": digest, "config": config, "record": record},
                      indent=1) + "\n"
    write_owned(meta, text.encode(), "config", overwrite, WRITE_FIX)
    return meta


def check_int8(weights, path):
    """A .safetensors state dict as read (shipped.read): each int8 tensor is a weight X.weight (in, out) with
    float32 scales X.weight_scale (out,), positive and finite, beside it, and each X.weight_scale scales one."""
    import torch

    for name, t in weights.items():
        if name.endswith(".weight" + SCALE):
            w = weights.get(name[:-len(SCALE)])
            if w is None or w.dtype != torch.int8:
                raise damaged(path, f"it holds scales {name} but no int8 weight {name[:-len(SCALE)]} for them")
        elif t.dtype == torch.int8:
            scale = weights.get(name + SCALE)
            if scale is None:
                raise damaged(path, f"its int8 weight {name} has no scales {name}{SCALE} beside it")
            if t.dim() != 2 or scale.dtype != torch.float32 or scale.shape != t.shape[1:]:
                raise damaged(path, f"its int8 weight {name} is {tuple(t.shape)} with scales {name}{SCALE} of "
                                    f"{scale.dtype} {tuple(scale.shape)}, where a weight (in, out) takes "
                                    f"float32 scales (out,)")
            if not ((scale > 0).all() and (scale <= MAX_WEIGHT / 127).all()):      # q * scale stays in range
                raise damaged(path, f"its scales {name}{SCALE} are not all positive and finite up to "
                                    f"{MAX_WEIGHT / 127:.3g} (the range imagegen-convert writes)")
