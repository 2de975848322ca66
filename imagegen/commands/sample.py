"""imagegen-sample: image grids and completions from a checkpoint (options: config.SampleConfig)."""
import time
from pathlib import Path

import torch

from ..store import checkpoint, shipped
from .cli import hydra_entry
from ..config import check_classes, check_sample
from ..data.sets import dataset_info, load_from_config
from ..files import check_target, write_image
from ..memory import check_request_fits, sampling_batch
from ..ops.build import prebuilt_only
from ..dtypes import dtype_name
from ..model.transformer import model_dims
from ..precision import precision_reason, resolve_precision, slow_bf16_note
from ..sampling.decode import completion_rows, generate, grid, name_rows, resolve_sampler, sampler_label, to_images
from ..sampling.threads import choose_threads


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


def check_labels_given(cfg, num_classes, class_names):
    """label= and labels=[...] name classes of the model (checked right after the checkpoint is read)."""
    if not num_classes:
        return
    if cfg["label"] is not None:
        check_classes([cfg["label"]], class_names, "label")
    if isinstance(cfg["labels"], list):
        check_classes(cfg["labels"], class_names)


def first_of_each_class(classes):
    """Indices (C,) of the first image of each class present in classes (N,), in class order."""
    return torch.stack([(classes == c).nonzero()[0, 0] for c in classes.unique(sorted=True)])


def default_out(path, mode):
    """<checkpoint stem>-<mode>.png beside the checkpoint, or in the current folder for a shipped model."""
    name = f"{path.stem}-{mode}.png"
    return Path(name) if shipped.is_shipped(path) else path.with_name(name)


def run_sample(cfg, device):
    check_sample(cfg)
    prebuilt_only()                          # never wait for the C++ kernel's first compile here
    path = shipped.resolve(cfg["checkpoint"])
    out = Path(cfg["out"]) if cfg["out"] else default_out(path, cfg["mode"])
    check_target(out, "sample grid", f"{cfg['mode']}.png")
    ck = checkpoint.load(path)
    info = dataset_info(ck["config"]["data"])
    num_classes = ck["config"]["model"]["num_classes"]
    check_labels_given(cfg, num_classes, info.class_names)
    rows = label_rows(cfg, num_classes) if cfg["mode"] == "grid" else None
    check_request_fits(cfg, info, label_rows=len(rows or []))
    if rows is not None and cfg["labels"] == "auto":
        print(f"labels=auto: a row of nrow={cfg['nrow']} images for each of the {len(rows)} classes "
              f"({len(rows) * cfg['nrow']} in all, not num_images); for num_images images pass label=N or labels=none.")
    model = checkpoint.model_from_checkpoint(ck, path).to(device).eval()
    sampler = resolve_sampler(model, cfg["sampler"])
    label = sampler_label(model, sampler)
    batch = sampling_batch(model, cfg["batch_size"], images_drawn(cfg, num_classes, info), sampler, device)
    measured = dict(dims=model_dims(model), batch=batch, record=ck.get("record"))  # for precision=auto
    dtype = resolve_precision(cfg["precision"], device, **measured)
    if note := slow_bf16_note(dtype, device):
        print(note)
    guidance = cfg["guidance"] if cfg["guidance"] is not None else ck.get("record", {}).get("guidance", 1.0)
    common = dict(sampler=sampler, temperature=cfg["temperature"], seed=cfg["seed"], batch_size=batch,
                  progress=cfg["progress"], dtype=dtype, guidance=guidance)
    def pick_threads(n):                     # threads=0: measured at the batch the loop will run
        if device.type == "cpu" and not cfg.get("threads") and sampler == "step":
            print(choose_threads(model, min(batch, n), dtype)[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if cfg["mode"] == "grid":
        labels, n = grid_labels(cfg, model)
        nrow = cfg["nrow"]
        pick_threads(n)
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
        pick_threads(len(prefix))
        seqs = generate(model, len(prefix), prefix=prefix, desc=f"{label} completing", labels=labels, **common)
        completions = to_images(seqs, info).reshape(len(originals), k, info.height, info.width, info.channels)
        images = completion_rows(to_images(originals, info), completions, keep)
        nrow = k + 2
        names = [info.class_names[c] for c in classes] if model.num_classes and cfg["row_names"] else None
    seconds = time.perf_counter() - start
    picture = grid(images, nrow=nrow, scale=cfg["scale"])
    write_image(out, name_rows(picture, names) if names else picture, "sample grid")
    if cfg["save_each"]:
        folder = out.with_suffix("")
        folder.mkdir(exist_ok=True)
        for i, img in enumerate(to_images(seqs, info)):
            write_image(folder / f"{i:04d}.png", grid(img[None], nrow=1, scale=cfg["scale"], pad=0), "sample")
    print(f"wrote {out} ({len(images)} tiles, {nrow} per row)")
    conditioning = ""
    if model.num_classes:
        conditioning = f", labels given, guidance {guidance:g}" if labels is not None else ", no labels"
    print(f"{len(seqs)} images in {seconds:.1f} s with the {label} sampler, batch {min(batch, len(seqs))}, "
          f"{dtype_name(dtype)} (precision={cfg['precision']}{precision_reason(cfg['precision'], device, **measured)})"
          f"{conditioning}: {len(seqs) / seconds:.2f} images/sec")


main = hydra_entry("sample", run_sample)

if __name__ == "__main__":
    main()
