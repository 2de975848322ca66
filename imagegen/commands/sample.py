"""imagegen-sample: image grids and completions from a checkpoint (options: config.SampleConfig)."""
import os
import time
from pathlib import Path

import torch

from ..store import checkpoint, shipped
from .cli import hydra_entry
from ..config import check_sample, class_numbers
from ..data.sets import dataset_info, load_from_config
from ..files import OUTPUTS, check_replaceable, check_target, encode_image, image_format, write_folder, write_owned
from ..memory import check_request_fits, sampling_batch
from ..ops.build import prebuilt_only
from ..dtypes import dtype_name
from ..errors import UserError
from ..model.transformer import model_dims
from ..precision import decide_precision, slow_bf16_note
from ..sampling.decode import completion_rows, generate, grid, name_rows, resolve_sampler, sampler_label, to_images
from ..sampling.threads import choose_threads
from ..say import show


def label_rows(cfg, num_classes):
    """The classes that each get a grid row of nrow images (labels=auto on a class-conditional model:
    every class; labels=[...]: those), or None when the grid draws num_images."""
    if not num_classes or cfg["label"] is not None or cfg["labels"] in ("none", None):
        return None
    return list(range(num_classes)) if cfg["labels"] == "auto" else cfg["labels"]


def grid_labels(cfg, model):
    """(labels (n,) or None, n) of a grid: label=N fills it with one class; a list of labels (or
    auto, on a class-conditional model: every class) gives each its row of nrow images."""
    rows = label_rows(cfg, model.num_classes)
    if rows is not None:
        return torch.tensor(rows).repeat_interleave(cfg["nrow"]), len(rows) * cfg["nrow"]
    if model.num_classes and cfg["label"] is not None:
        return torch.tensor([cfg["label"]]), cfg["num_images"]
    return None, cfg["num_images"]


def images_drawn(cfg, num_classes, info):
    """How many images the request samples at most (grid: num_images, or nrow per label row; complete:
    completions for each original: num_originals, or one per class of the data)."""
    if cfg["mode"] == "complete":
        originals = max(1, info.num_classes) if cfg["originals"] == "per_class" else cfg["num_originals"]
        return originals * cfg["completions"]
    rows = label_rows(cfg, num_classes)
    return len(rows) * cfg["nrow"] if rows is not None else cfg["num_images"]


def labels_given(cfg, num_classes, class_names):
    """cfg with label= and labels=[...] as class numbers (a name looked up in class_names), each checked to
    be a class of the model (config.class_numbers, as the Python API's), right after the checkpoint is read."""
    if not num_classes:
        return cfg
    label = None if cfg["label"] is None else class_numbers(cfg["label"], class_names, "label")[0]
    labels = class_numbers(cfg["labels"], class_names) if isinstance(cfg["labels"], list) else cfg["labels"]
    return {**cfg, "label": label, "labels": labels}


def first_of_each_class(classes):
    """Indices (C,) of the first image of each class present in classes (N,), in class order."""
    return torch.stack([(classes == c).nonzero()[0, 0] for c in classes.unique(sorted=True)])


def default_out(path, mode):
    """<checkpoint stem>-<mode>.png beside the checkpoint, or in the current folder for a shipped model."""
    name = f"{path.stem}-{mode}.png"
    return Path(name) if shipped.is_shipped(path) else path.with_name(name)


def each_names(out, n):
    """save_each=true: the folder <out without its suffix>/ and its n file names (0000.png, ...)."""
    return out.with_suffix(""), [f"{i:04d}{out.suffix}" for i in range(n)]


def check_outputs(cfg, out, n=None):
    """Refuse, before sampling, what the end would refuse (files.check_replaceable): a file at out,
    or (n given, save_each=true) one of n files in its folder, that imagegen did not write there or
    that changed since, unless overwrite=true."""
    check_replaceable(out.parent, {out.name: None}, "sample grid", cfg["overwrite"], OUTPUTS)
    if n is None or not cfg["save_each"]:
        return
    folder, names = each_names(out, n)
    if os.path.lexists(folder) and not folder.is_dir():
        raise UserError(f"save_each=true writes each image into the folder {folder}, but {folder} is a file; move "
                        f"it away or choose another out=... (nothing was written).")
    if folder.is_dir():
        check_replaceable(folder, dict.fromkeys(names), "samples", cfg["overwrite"])


def run_sample(cfg, device):
    check_sample(cfg)
    prebuilt_only()                          # never wait for the C++ kernel's first compile here
    path = shipped.resolve(cfg["checkpoint"])
    out = Path(cfg["out"]) if cfg["out"] else default_out(path, cfg["mode"])
    check_target(out, "sample grid", f"{cfg['mode']}.png")
    ck = checkpoint.load(path)
    info = dataset_info(ck["config"]["data"])
    fmt = image_format(out, "L" if info.channels == 1 else "RGB")
    check_outputs(cfg, out)                  # after the format: overwrite=true, when advised, then works
    num_classes = ck["config"]["model"]["num_classes"]
    cfg = labels_given(cfg, num_classes, info.class_names)
    rows = label_rows(cfg, num_classes) if cfg["mode"] == "grid" else None
    check_request_fits(cfg, info, label_rows=len(rows or []))
    if rows is not None and cfg["labels"] == "auto":
        show(f"labels=auto: a row of nrow={cfg['nrow']} images for each of the {len(rows)} classes "
                      f"({len(rows) * cfg['nrow']} in all, not num_images); for num_images images pass label=N or "
                      f"labels=none.", wrap=True)
    model = checkpoint.model_from_checkpoint(ck, path).to(device).eval()
    sampler = resolve_sampler(model, cfg["sampler"])
    label = sampler_label(model, sampler)
    batch = sampling_batch(model, cfg["batch_size"], images_drawn(cfg, num_classes, info), sampler, device)
    measured = dict(dims=model_dims(model), batch=batch, record=ck.get("record"))  # for precision=auto
    precision = decide_precision(cfg["precision"], device, **measured)
    dtype = precision.value
    if note := slow_bf16_note(dtype, device):
        show(note)
    guidance = cfg["guidance"] if cfg["guidance"] is not None else ck.get("record", {}).get("guidance", 1.0)
    common = dict(sampler=sampler, temperature=cfg["temperature"], seed=cfg["seed"], batch_size=batch,
                  progress=cfg["progress"], dtype=dtype, guidance=guidance)
    def before_sampling(n):                  # the outputs checked again; threads=0: measured at the batch the loop runs
        check_outputs(cfg, out, n)
        if device.type == "cpu" and not cfg.get("threads") and sampler == "step":
            if line := choose_threads(model, min(batch, n), dtype)[1]:
                show(line, wrap=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if cfg["mode"] == "grid":
        labels, n = grid_labels(cfg, model)
        nrow = cfg["nrow"]
        before_sampling(n)
        seqs = generate(model, n, desc=f"{label} sampling", labels=labels, **common)
        images = to_images(seqs, info)
        rows = label_rows(cfg, model.num_classes)
        names = [info.class_names[c] if c >= 0 else "no label" for c in rows] if rows and cfg["row_names"] else None
    else:                                    # mode=complete (check_sample allows no other)
        ((originals, classes),) = load_from_config(ck["config"]["data"], ("test",), cfg["data"], labels=True)
        chosen = first_of_each_class(classes) if cfg["originals"] == "per_class" else slice(cfg["num_originals"])
        originals, classes = originals[chosen], classes[chosen]
        k = cfg["completions"]
        keep = info.height // 2
        prefix = originals[:, : keep * info.width * info.channels].repeat_interleave(k, dim=0)
        labels = classes.repeat_interleave(k) if model.num_classes and cfg["labels"] not in ("none", None) else None
        before_sampling(len(prefix))
        seqs = generate(model, len(prefix), prefix=prefix, desc=f"{label} completing", labels=labels, **common)
        completions = to_images(seqs, info).reshape(len(originals), k, info.height, info.width, info.channels)
        images = completion_rows(to_images(originals, info), completions, keep)
        nrow = k + 2
        names = [info.class_names[c] for c in classes] if model.num_classes and cfg["row_names"] else None
    seconds = time.perf_counter() - start
    picture = grid(images, nrow=nrow, scale=cfg["scale"])
    write_owned(out, encode_image(name_rows(picture, names) if names else picture, fmt), "sample grid",
                cfg["overwrite"])
    show(f"wrote {out} ({len(images)} tiles, {nrow} per row)")
    if cfg["save_each"]:
        folder, names = each_names(out, len(seqs))
        each = [encode_image(grid(img[None], nrow=1, scale=cfg["scale"], pad=0), fmt) for img in to_images(seqs, info)]
        write_folder(folder, dict(zip(names, each)), "samples", cfg["overwrite"])
        show(f"wrote {len(each)} images into {folder}")
    conditioning = ""
    if model.num_classes:
        conditioning = f", labels given, guidance {guidance:g}" if labels is not None else ", no labels"
    show(f"{len(seqs)} images in {seconds:.1f} s ({len(seqs) / seconds:.2f} images/sec): the {label} sampler, "
          f"batch {min(batch, len(seqs))}, {dtype_name(dtype)}{conditioning}")
    if precision.reason:
        show(f"precision={cfg['precision']} took {dtype_name(dtype)}: {precision.reason}", wrap=True)


main = hydra_entry("sample", run_sample)

if __name__ == "__main__":
    main()
