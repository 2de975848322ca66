"""Checks of a composed config before anything heavy starts: ranges (positive sizes, lr > 0, ...), the
attention's options against its dataclass (schema.py), the classes asked for. Each failure is one
UserError sentence naming the option and the fix."""
import math
import numbers
from dataclasses import MISSING, fields
from typing import Any

from ..errors import UserError
from .registry import type_name
from .schema import ACTIVATIONS, ATTENTION_OPTIONS, TrainConfig
from .typed import plain, typed


def attention_options(attention, options, schema=None):
    """A model config's attention_options (a plain dict as configs and checkpoints hold it: empty, partial
    or whole; or the options dataclass a composed config holds) as the attention's options dataclass, the
    missing ones at their defaults; a UserError of one sentence for an option the attention does not have or a
    value of the wrong type. schema: the options dataclass (None: ATTENTION_OPTIONS[attention])."""
    schema = schema or ATTENTION_OPTIONS[attention]
    known = {f.name: f.type for f in fields(schema)}
    options = plain(options or {})
    for key, value in options.items():
        if key not in known:
            raise UserError(unknown_option(attention, key, schema))
        if not fits(value, known[key]):
            raise UserError(f"model.attention_options.{key} of the {attention} attention must be "
                            f"{type_name(known[key])}, got {value!r}.")
    return schema(**options)


def unknown_option(attention, key, schema=None):
    """The sentence for model.attention_options.KEY that the attention does not have."""
    import difflib

    names = [f.name for f in fields(schema or ATTENTION_OPTIONS[attention])]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]}?" if close else ""
    takes = f"its options are {', '.join(names)}" if names else "it takes none"
    return (f"the {attention} attention has no option {key!r} (model.attention_options.{key}{hint}); {takes} "
            f"(--help lists each attention's).")


def fits(value, kind):
    """value is of the annotated type kind: int (not bool), float (or int), str, bool, Optional[...] of those."""
    if kind in (Any, object):
        return True
    args = getattr(kind, "__args__", None)
    if args:                                              # Optional[X]
        return any(fits(value, a) for a in args)
    if kind is type(None):
        return value is None
    if kind is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    return isinstance(value, kind)


def full_attention_options(attention, options):
    """attention_options with every option of the attention, the missing ones at their defaults (a plain
    dict); unchanged for an attention with no options dataclass."""
    if attention not in ATTENTION_OPTIONS:
        return dict(options or {})
    schema = ATTENTION_OPTIONS[attention]
    defaults = {f.name: (f.default_factory() if f.default_factory is not MISSING else f.default)
                for f in fields(schema)}
    return {**defaults, **(options or {})}


# ---------------------------------------------------------------- range checks
def positive(cfg_section, keys, prefix):
    for key in keys:
        value = cfg_section[key]
        if value is None or value <= 0:
            raise UserError(f"{prefix}{key} must be a positive number, got {value}; pass {prefix}{key}=N with N > 0.")


def fraction(value, key, low_open=False, high_open=False):
    if not (0 <= value <= 1) or (low_open and value == 0) or (high_open and value == 1):
        interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
        raise UserError(f"{key} must lie in {interval}, got {value}.")


def finite(value, key, span):
    """value a finite number (not bool); else one sentence naming key and its range (span, e.g. "> 0"). NaN
    and inf slip past the comparisons of a range check (nan <= 0 is false), so every float is checked here first."""
    if not (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)):
        raise UserError(f"{key} must be a finite number {span}, got {shown(value)}; pass {key}=X with X {span}.")


# The floats of the train section, each with its range in words (checked for range in check_train)
TRAIN_FLOATS = {"lr": "> 0", "weight_decay": ">= 0", "grad_clip": ">= 0 (0: no clipping)", "min_lr_ratio": "in [0, 1]",
                "label_dropout": "in [0, 1]", "ema": "in [0, 1) (0: off)", "max_minutes": "> 0 (null: no time budget)",
                "sample_minutes": ">= 0 (0: only by steps)", "muon_lr": "> 0 (null: lr)", "muon_momentum": "in [0, 1)",
                "target_bpd": "> 0 (null: none)"}


def check_train_floats(cfg):
    """Every float of imagegen-train's config finite (train.*, its betas, data.val_fraction), before a range check
    or the optimizer sees it."""
    t = cfg.train
    for key, span in TRAIN_FLOATS.items():
        if getattr(t, key) is not None:
            finite(getattr(t, key), f"train.{key}", span)
    for beta in t.betas:
        finite(beta, "train.betas", "in [0, 1), two of them")
    finite(cfg.data.val_fraction, "data.val_fraction", "in (0, 1)")


def check_model(m, memory_bytes=None, prefix="model.", length=None):
    """Sizes positive, dropout a rate, context distances below the sequence length D (`length`, when
    given), and the parameters (with gradients and Adam's two moments) within `memory_bytes` when given."""
    positive(m, ("n_layers", "d_model", "n_heads", "d_ff", "n_mixtures"), prefix)
    finite(m["dropout"], prefix + "dropout", "in [0, 1]")
    fraction(m["dropout"], prefix + "dropout")
    if m.get("num_classes", 0) < 0:
        raise UserError(f"{prefix}num_classes must be >= 0 (0: unconditional), got {m['num_classes']}.")
    if m["d_model"] % m["n_heads"]:
        raise UserError(f"{prefix}d_model={m['d_model']} is not a multiple of {prefix}n_heads={m['n_heads']}; "
                        f"pick values that divide.")
    if m.get("activation", "gelu") not in ACTIVATIONS:
        raise UserError(f"{prefix}activation must be one of {', '.join(ACTIVATIONS)}, got {m['activation']!r}.")
    context = list(m.get("context") or [])
    if any(not isinstance(o, int) or o < 2 for o in context) or len(set(context)) < len(context):
        raise UserError(f"{prefix}context must list distinct sub-pixel distances >= 2 (1 is the input byte itself), "
                        f"got {context}.")
    if length and context and max(context) >= length:      # it would read only the start symbol
        raise UserError(f"{prefix}context holds {max(context)}, but an image of this data is {length} sub-pixels "
                        f"long, so that distance never reaches a byte; use distances from 2 to {length - 1}.")
    if memory_bytes:
        d, ff = m["d_model"], m["d_ff"]
        params = m["n_layers"] * (4 * d * d + 2 * d * ff) + 300 * d
        need = 16 * params                   # float32 weights, gradients and two Adam moments
        if need > memory_bytes:
            raise UserError(f"the model has about {params / 1e9:.1f}G parameters, needing {need / 2**30:.0f} GiB "
                            f"for weights, gradients and optimizer state, more than the {memory_bytes / 2**30:.0f} GiB "
                            f"available; lower model.n_layers, model.d_model or model.d_ff.")


def check_train(cfg, memory_bytes=None, length=None):
    """The train, data and model sections of an imagegen-train config (a TrainConfig, or a dict of one);
    length: the data's sequence length D."""
    cfg = typed(TrainConfig, cfg)
    t = cfg.train
    check_train_floats(cfg)
    positive(vars(t), ("batch_size", "lr", "max_steps", "val_every", "val_images", "save_every", "log_every",
                       "sample_images"), "train.")
    if t.max_minutes is not None:
        positive(vars(t), ("max_minutes",), "train.")
    if t.clock not in ("wall", "cpu"):
        raise UserError(f"train.clock must be wall or cpu, got {t.clock!r}.")
    for key in ("warmup_steps", "weight_decay", "grad_clip", "sample_every", "sample_minutes"):
        if getattr(t, key) < 0:
            raise UserError(f"train.{key} must be >= 0, got {getattr(t, key)}.")
    fraction(t.min_lr_ratio, "train.min_lr_ratio")
    fraction(t.label_dropout, "train.label_dropout")
    if not 0 <= t.ema < 1:
        raise UserError(f"train.ema must lie in [0, 1) (0: off), got {t.ema}.")
    if len(t.betas) != 2 or not all(0 <= b < 1 for b in t.betas):
        raise UserError(f"train.betas must be two numbers in [0, 1), got {t.betas}.")
    check_recipe(t)
    fraction(cfg.data.val_fraction, "data.val_fraction", low_open=True, high_open=True)  # both splits non-empty
    check_model(plain(cfg.model), memory_bytes, length=length)
    if cfg.model.attention in ATTENTION_OPTIONS:     # an option the attention lacks (+key=...), a wrong type
        attention_options(cfg.model.attention, cfg.model.attention_options)


def check_recipe(t):
    """The speedrun's options of the train section (TrainOptions): Muon's, the validation target."""
    if t.optimizer not in ("adamw", "adam", "radam", "muon"):
        raise UserError(f"train.optimizer must be adamw, adam, radam or muon, got {shown(t.optimizer)}.")
    if t.decay not in ("cosine", "linear"):
        raise UserError(f"train.decay must be cosine or linear, got {shown(t.decay)}.")
    if t.muon_lr is not None:
        positive(vars(t), ("muon_lr",), "train.")
    if not 0 <= t.muon_momentum < 1:
        raise UserError(f"train.muon_momentum must lie in [0, 1), got {t.muon_momentum}.")
    if t.target_bpd is not None:
        positive(vars(t), ("target_bpd",), "train.")


# Guidance past this stops helping: above G = 1 a value is lifted at most e^((G-1)B) times over p_c
# (B = model.heads.GUIDANCE_BOUND = 0.5): e^5.5, about 245, at G = 12, the 256 values' range; above it a
# value the class rates below 1/256 of its likeliest overtakes it, and samples turn to streaks and noise
# (mnist-linear: samples' own bits/dim 0.83 at G = 1, 1.86 at 12, 2.59 at 16, 7.6 at 100; docs/guidance.md).
MAX_GUIDANCE = 12


MAX_SEED = 2 ** 64 - 1          # torch.Generator.manual_seed takes an unsigned 64-bit seed


def shown(value, limit=40):
    """value as a message shows it: a string quoted, anything else as printed, cut at `limit` characters."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def whole(value, key, low=1, high=None, span=None, note=""):
    """value as an int when it is a whole number (int or numpy integer, not bool) in low..high (None: no
    bound); else one sentence naming key and the range (span: the range in words, e.g. "in 0..2**64-1";
    note: what the values mean, e.g. " (0: the cores free now)")."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and low <= value \
            and (high is None or value <= high):
        return int(value)
    if (low, high) == (1, None):
        raise UserError(f"{key} must be a positive number, got {shown(value)}; pass {key}=N with N a whole "
                        f"number > 0{note}.")
    span = span or (f"in {low}..{high}" if high is not None else f">= {low}")
    raise UserError(f"{key} must be {span} (a whole number), got {shown(value)}; pass {key}=N with N a whole "
                    f"number {span}{note}.")


def check_sampling(**values):
    """The numbers of a sampling request, checked alike for imagegen-sample (check_sample), every command's
    threads= (cli.resolve_device) and the Python API: counts (n, num_images, nrow, batch_size, ...) whole
    numbers > 0, seed a whole number in 0..2**64-1 (what torch's generator takes), threads a whole number
    >= 0 (None: torch's count left alone), temperature a finite number > 0, guidance a finite number from 0
    up to MAX_GUIDANCE (None: the model's default); one sentence naming the value and the fix."""
    for key, value in values.items():
        if key == "guidance":
            if value is not None and not (isinstance(value, numbers.Real) and math.isfinite(value) and value >= 0):
                raise UserError(f"guidance must be a finite number >= 0, got {shown(value)}; pass guidance=G with "
                                f"G >= 0 (1: the plain conditional distribution).")
            if value is not None and value > MAX_GUIDANCE:
                raise UserError(f"guidance must be at most {MAX_GUIDANCE}, got {value:g}: past {MAX_GUIDANCE} it stops "
                                f"helping and samples turn to streaks and noise (docs/guidance.md); the shipped models "
                                f"sample at 3 (mnist-linear) and 6 (cifar10-linear).")
        elif key == "temperature":
            if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
                raise UserError(f"temperature must be a finite number > 0, got {shown(value)}; pass temperature=T "
                                f"with T > 0 (1 samples the model's distribution).")
        elif key == "seed":
            whole(value, key, 0, MAX_SEED, "in 0..2**64-1")
        elif key == "threads":
            if value is not None:
                check_threads(value)
        else:
            whole(value, key)


def check_device(name):
    """The torch device a device= value names (auto: cuda when torch sees a GPU, else cpu; a torch.device
    is taken as it is); one sentence for a name torch does not know or a device this machine cannot use."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(name).startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device={name} asked for, but this torch build sees no CUDA GPU; use device=cpu or "
                        f"device=auto.")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise UserError(f"unknown device {shown(name)}; use auto, cpu, cuda or cuda:N.") from None
    if device.type != "cpu":
        try:
            torch.empty(0, device=device)
        except (RuntimeError, AssertionError) as e:      # cuda:5 on a one-GPU machine, mps elsewhere, ...
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            reason = reason if len(reason) <= 100 else reason[:100].rsplit(" ", 1)[0] + " ..."
            raise UserError(f"device={device} cannot be used on this machine ({reason}); use device=cpu or "
                            f"device=auto.") from None
    return device


def check_classes(labels, class_names, key="labels"):
    """Each of labels (class numbers) names a class of the model, or is -1 (no label); else one sentence
    naming the bad one and the classes there are."""
    bad = [v for v in labels if not -1 <= v < len(class_names)]
    if bad:
        raise UserError(f"{key} holds {shown(bad[0])}, which is not a class of this model; use class numbers "
                        f"0..{len(class_names) - 1}{named_classes(class_names)}.")


def named_classes(class_names):
    """" (0: airplane, 1: automobile, ...)" for classes with names other than their numbers, else ""."""
    named = [f"{i}: {n}" for i, n in enumerate(class_names) if n != str(i)]
    return f" ({', '.join(named[:10])}{', ...' if len(named) > 10 else ''})" if named else ""


def class_numbers(labels, class_names, key="labels"):
    """labels as a list of class numbers: one class or a flat sequence of them (a list, a numpy array or a
    torch tensor), each a class number (-1: no label) or a name in class_names; one sentence for anything
    else (a fraction, a nested list, an unknown name, an unconditional model)."""
    if not class_names:
        raise UserError(f"this model is unconditional (trained without labels); leave out {key}=, or train with "
                        f"model.num_classes=10.")
    values = labels.tolist() if hasattr(labels, "tolist") else labels
    if isinstance(values, (str, numbers.Number)):
        values = [values]
    if not isinstance(values, (list, tuple)) or not values:
        raise UserError(f"{key} must be one class or a list of them, got {shown(labels)}; pass e.g. {key}=[0, 1].")
    numbers_ = []
    for v in values:
        if isinstance(v, str) and v in class_names:
            numbers_.append(list(class_names).index(v))
        elif isinstance(v, numbers.Integral) and not isinstance(v, bool):
            numbers_.append(int(v))
        else:
            raise UserError(f"{key} holds {shown(v)}, which is neither a class number nor a class name of this "
                            f"model; give each image a class number 0..{len(class_names) - 1} (-1: none) or a class "
                            f"name{named_classes(class_names)}, e.g. {key}=[0, 1].")
    check_classes(numbers_, class_names, key)
    return numbers_


def check_sample(cfg):
    if cfg.mode not in ("grid", "complete"):
        raise UserError(f"unknown mode {cfg.mode!r}; use mode=grid or mode=complete.")
    if cfg.originals not in ("first", "per_class"):
        raise UserError(f"originals must be first or per_class, got {cfg.originals!r}.")
    check_sampling(**{k: getattr(cfg, k) for k in ("num_images", "num_originals", "completions", "nrow", "scale",
                                                   "batch_size", "temperature", "guidance", "seed")})
    labels = cfg.labels
    if not (labels in ("auto", "none", None) or (isinstance(labels, list) and labels and all(
            isinstance(v, str) or isinstance(v, int) and not isinstance(v, bool) for v in labels))):
        raise UserError(f"labels must be auto, none or a list of class numbers or names such as labels=[0,1,2], "
                        f"got {labels!r}.")
    if cfg.label is not None and isinstance(labels, list):
        raise UserError("give label=N (one class for the whole grid) or labels=[...] (a row per class), not both.")


def check_eval(cfg):
    positive(vars(cfg), ("batch_size", "lsh_draws"), "")      # positive reads a section's dict (check_model's too)
    if cfg.max_images is not None:
        positive(vars(cfg), ("max_images",), "")


def check_threads(threads):
    """threads (a command's threads=, the API's load(threads=)) a whole number >= 0; one sentence otherwise.
    Every command checks it at start, those that run no torch too (imagegen.tuning.threads caps it at the cores)."""
    whole(threads, "threads", 0, note=" (0: the cores free now; N: N threads, at most the cores)")


def composed(node):
    """A command's composed config (an OmegaConf node of its schema) as the schema's dataclass, resolved; a
    UserError of one sentence for a key added with + that the schema has no field for (to_object drops it)."""
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(node, resolve=True)
    model = tree.get("model")
    if isinstance(model, dict) and model.get("attention_options"):
        attention_options(model["attention"], model["attention_options"])     # the sentence that names its options
    obj = OmegaConf.to_object(node)
    extra = next(iter(_extra(tree, plain(obj))), None)
    if extra:
        raise UserError(f"{extra} is no option of this command; drop it (see the command's --help).")
    return obj


def _extra(tree, kept, prefix=""):
    """The dotted keys of `tree` (a nested dict) that `kept` lacks."""
    for key, value in tree.items():
        if key not in kept:
            yield prefix + str(key)
        elif isinstance(value, dict) and isinstance(kept[key], dict):
            yield from _extra(value, kept[key], f"{prefix}{key}.")
