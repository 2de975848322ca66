"""Models in the shippable form: weights as .safetensors (no pickle, nothing in them can run) beside
a JSON file holding the config, found by path or by name (checkpoint=mnist-linear) among the models
that ship in the package's checkpoints/ folder.

  NAME.safetensors   the weights (the average of the weights when the run kept one), float32
  NAME.json          {"format": "imagegen/1", "config": {"model", "data", "train"}, "record": {...}}
  NAME.md            the model card: how it was trained and what it scores (shipped models)

`read` gives the same dict as a .pt checkpoint's {"format", "config", "model"} (plus "record"),
so every command checks and loads either the same way (checkpoint.load). The run checkpoints
(.pt) stay the form to resume from: they also hold the optimizer and the run state.
"""
import json
import os
from pathlib import Path

from ..errors import UserError
from ..paths import data_dir
from .format import FORMAT

SHIPPED = data_dir("checkpoints")
DEFAULT = "mnist-linear"          # what imagegen-sample draws from when no checkpoint is named
MAX_CONFIG_BYTES = 1 << 20


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
    return str(Path(os.environ.get("IMAGEGEN_DATA", "data")) / dataset)


def read(path):
    """{"format", "config", "model" (state_dict), "record"} of the .safetensors file `path` and its .json."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    config_path = path.with_suffix(".json")
    fix = "convert the run's best.pt again with imagegen-convert, or use another checkpoint."
    if not config_path.is_file():
        raise UserError(f"{path} has no config beside it ({config_path.name} is missing); {fix}")
    try:
        if config_path.stat().st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"larger than {MAX_CONFIG_BYTES} bytes")
        meta = json.loads(config_path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{config_path} is not a readable config ({e}); {fix}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise UserError(f"{config_path} holds no config section; {fix}")
    try:
        weights = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise UserError(f"{path} is not a readable .safetensors file (damaged or truncated: {reason}); {fix}") from None
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
    return {"model": model, "data": data, "train": dict(config.get("train", {}))}


WRITE_FIX = "free space or choose another out=..."


def weights_bytes(state_dict):
    """The .safetensors bytes of a state dict (float32, contiguous, on the CPU)."""
    import torch
    from safetensors.torch import save

    return save({k: v.detach().to(torch.float32).contiguous().cpu() for k, v in state_dict.items()})


def write(stem, config, weights, record):
    """Write STEM.safetensors (weights: a state dict or weights_bytes' bytes) and STEM.json (config:
    shippable_config's, recorded as given), each atomically through
    files.write_bytes; returns the two paths. When the .json cannot be written, the .safetensors
    written just before is removed: a failed write leaves no half model behind."""
    from ..files import write_bytes

    path = Path(stem).with_suffix(".safetensors")
    write_bytes(path, weights if isinstance(weights, bytes) else weights_bytes(weights), "weights", WRITE_FIX)
    try:
        return path, write_config(stem, config, record)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def write_config(stem, config, record):
    """Write STEM.json alone (a shippable_config and the record beside STEM.safetensors); returns its path."""
    from ..files import write_bytes

    meta = Path(stem).with_suffix(".json")
    text = json.dumps({"format": FORMAT, "config": config, "record": record}, indent=1) + "\n"
    write_bytes(meta, text.encode(), "config", WRITE_FIX)
    return meta
