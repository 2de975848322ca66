"""imagegen-sample: image grids and completions from a checkpoint (options: config.SampleConfig), a thin
layer over the Python API (imagegen.api: load, Model.sampling_plan, generate, complete, grid) with its
defaults: this module parses the config, calls the API, writes the files and prints."""
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..api import load
from ..store import shipped
from .cli import hydra_entry
from ..config import SampleConfig, check_sample, class_numbers, typed
from ..files import OUTPUTS, check_replaceable, check_target, encode_image, image_format, write_folder, write_owned
from ..memory import check_request_fits
from ..errors import UserError
from ..say import show


def label_rows(cfg, num_classes):
    """The classes that each get a grid row of nrow images (labels=auto on a class-conditional model:
    every class; labels=[...]: those), or None when the grid draws num_images."""
    if not num_classes or cfg.label is not None or cfg.labels in ("none", None):
        return None
    return list(range(num_classes)) if cfg.labels == "auto" else cfg.labels


def grid_labels(cfg, num_classes):
    """(labels: a list of n class numbers or None, n) of a grid: label=N fills it with one class; a list of
    labels (or auto, on a class-conditional model: every class) gives each its row of nrow images."""
    rows = label_rows(cfg, num_classes)
    if rows is not None:
        return [c for c in rows for _ in range(cfg.nrow)], len(rows) * cfg.nrow
    if num_classes and cfg.label is not None:
        return [cfg.label], cfg.num_images
    return None, cfg.num_images


def labels_given(cfg, num_classes, class_names):
    """cfg with label= and labels=[...] as class numbers (a name looked up in class_names), each checked to
    be a class of the model (config.class_numbers, as the Python API's), right after the checkpoint is read."""
    if not num_classes:
        return cfg
    label = None if cfg.label is None else class_numbers(cfg.label, class_names, "label")[0]
    labels = class_numbers(cfg.labels, class_names) if isinstance(cfg.labels, list) else cfg.labels
    return replace(cfg, label=label, labels=labels)


def first_of_each_class(classes):
    """Indices (C,) of the first image of each class present in classes (N,), in class order."""
    return np.unique(np.asarray(classes), return_index=True)[1]


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
    check_replaceable(out.parent, {out.name: None}, "sample grid", cfg.overwrite, OUTPUTS)
    if n is None or not cfg.save_each:
        return
    folder, names = each_names(out, n)
    if os.path.lexists(folder) and not folder.is_dir():
        raise UserError(f"save_each=true writes each image into the folder {folder}, but {folder} is a file; move "
                        f"it away or choose another out=... (nothing was written).")
    if folder.is_dir():
        check_replaceable(folder, dict.fromkeys(names), "samples", cfg.overwrite)


def run_sample(cfg, device):
    cfg = typed(SampleConfig, cfg)
    check_sample(cfg)
    path = shipped.resolve(cfg.checkpoint)
    out = Path(cfg.out) if cfg.out else default_out(path, cfg.mode)
    check_target(out, "sample grid", f"{cfg.mode}.png")
    # threads=None: the command fitted them (cli.resolve_device); never wait for the C++ kernel's first compile
    model = load(path, device, threads=None, build_kernel=False)
    info, num_classes = model.info, len(model.class_names)
    fmt = image_format(out, "L" if info.channels == 1 else "RGB")
    check_outputs(cfg, out)                  # after the format: overwrite=true, when advised, then works
    cfg = labels_given(cfg, num_classes, info.class_names)
    rows = label_rows(cfg, num_classes) if cfg.mode == "grid" else None
    check_request_fits(cfg, info, label_rows=len(rows or []))
    if rows is not None and cfg.labels == "auto":
        show(f"labels=auto: a row of nrow={cfg.nrow} images for each of the {len(rows)} classes "
             f"({len(rows) * cfg.nrow} in all, not num_images); for num_images images pass label=N or "
             f"labels=none.", wrap=True)
    if cfg.mode == "grid":
        labels, n = grid_labels(cfg, num_classes)
    else:                                    # mode=complete (check_sample allows no other)
        per_class, data = cfg.originals == "per_class", cfg.data
        originals, classes = model.load_split("test", None if per_class else cfg.num_originals, data.root,
                                              data.download, data.mirror)
        if per_class:
            chosen = first_of_each_class(classes)
            originals, classes = originals[chosen], classes[chosen]
        labels = classes.tolist() if num_classes and cfg.labels not in ("none", None) else None
        n = len(originals) * cfg.completions
    plan = model.sampling_plan(n, cfg.precision, cfg.batch_size, cfg.sampler)
    if plan.note:
        show(plan.note)
    check_outputs(cfg, out, n)               # the outputs checked again; threads=0: measured at the plan's batch
    if not cfg.threads and (line := model.measure_threads(plan)):
        show(line, wrap=True)
    common = dict(temperature=cfg.temperature, guidance=cfg.guidance, seed=cfg.seed,
                  progress=cfg.progress, plan=plan)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if cfg.mode == "grid":
        each = model.generate(n, labels=labels, **common)
        seconds = time.perf_counter() - start
        names = ([info.class_names[c] if c >= 0 else "no label" for c in rows] if rows and cfg.row_names
                 else None)
        nrow = cfg.nrow
        picture = model.grid(each, nrow=nrow, scale=cfg.scale, row_names=names)
    else:
        completions = model.complete(originals, n=cfg.completions, labels=labels, **common)
        seconds = time.perf_counter() - start
        each = completions.reshape(-1, *completions.shape[2:])
        names = [info.class_names[c] for c in classes] if num_classes and cfg.row_names else None
        nrow = cfg.completions + 2
        picture = model.grid(completions, scale=cfg.scale, originals=originals, row_names=names)
    write_owned(out, encode_image(picture, fmt), "sample grid", cfg.overwrite)
    tiles = len(each) if cfg.mode == "grid" else len(originals) * nrow
    show(f"wrote {out} ({tiles} tiles, {nrow} per row)")
    if cfg.save_each:
        folder, files = each_names(out, len(each))
        encoded = [encode_image(model.grid(img[None], nrow=1, scale=cfg.scale, pad=0), fmt) for img in each]
        write_folder(folder, dict(zip(files, encoded)), "samples", cfg.overwrite)
        show(f"wrote {len(encoded)} images into {folder}")
    conditioning = ""
    if num_classes:
        guidance = model.guidance if cfg.guidance is None else cfg.guidance
        conditioning = f", labels given, guidance {guidance:g}" if labels is not None else ", no labels"
    show(f"{len(each)} images in {seconds:.1f} s ({len(each) / seconds:.2f} images/sec): the {plan.loop} sampler, "
         f"batch {plan.batch}, {plan.precision}{conditioning}")
    if plan.reason:
        show(f"precision={cfg.precision} took {plan.precision}: {plan.reason}", wrap=True)


main = hydra_entry("sample", run_sample)

if __name__ == "__main__":
    main()
