"""imagegen-data prepare: build (or check) a dataset's cache, say what it holds, and draw real images
exactly as the model will see them (Hydra app; see conf/prepare.yaml).

For a folder whose cache is up to date and whose grid is already drawn it never imports torch, so
that checking a cache takes about as long as listing the folder."""
import sys
from pathlib import Path

import numpy as np

from ..data import imagecache, source
from .cli import hydra_entry, interrupted
from ..errors import UserError, printable
from ..say import show
from ..files import check_target, encode_image, image_format, write_owned

VERBS = ("prepare",)


def class_table(names, labels_by_split):
    """Rows 'class  train  val  test' with each class's count per split."""
    names = [printable(n) for n in names]           # escaped before the columns are measured
    width = max([len("class")] + [len(n) for n in names])
    splits = list(labels_by_split)
    rows = [f"  {'class':<{width}}" + "".join(f"{s:>9}" for s in splits)]
    for k, name in enumerate(names):
        rows.append(f"  {name:<{width}}" + "".join(f"{int((y == k).sum()):>9,}" for y in labels_by_split.values()))
    return rows


def folder_report(d, cfg):
    """Build or check the folder's cache; returns (lines, training rows (None: the cache's grid is already
    drawn and no other was asked for), image shape, default grid path)."""
    cache, why = source.open_cache(d, progress=cfg.progress, check_only=cfg.check)
    where = source.cache_dir(d)
    if cfg.check and cache is None:
        show(f"the cache {where} of {d['root']} is out of date: {why}; run imagegen-data prepare without check=true "
              f"(or train) to build it")
        sys.exit(1)
    s = source.settings(d)
    rows = source.split_rows(cache.splits, ("train", "val", "test"), d.get("val_fraction", 0.05),
                             d.get("test_fraction", 0.1), d.get("split_seed", 0))
    size = sum(p.stat().st_size for p in where.iterdir() if p.is_file())
    m = cache.manifest
    lines = [f"{d['root']}: {len(cache.images):,} images of {s.height}x{s.width}x{s.channels} ({s.length:,} "
             f"sub-pixels each, fit={s.fit}), cache {where} ({size:,} bytes), "
             f"{'up to date' if why is None else 'built now'}",
             "splits: " + ", ".join(f"{k} {len(v):,}" for k, v in rows.items())
             + ("" if (cache.splits >= 0).any() else
                f" (seeded shares: data.test_fraction {d.get('test_fraction', 0.1)}, data.val_fraction "
                f"{d.get('val_fraction', 0.05)}, data.split_seed {d.get('split_seed', 0)})")]
    if cache.class_names:
        lines += [f"{len(cache.class_names)} classes (the first level of folders):"]
        lines += class_table(cache.class_names, {k: cache.labels[v] for k, v in rows.items()})
    else:
        lines.append("no class folders: unlabelled (train an unconditional model, model.num_classes=0)")
    if m.get("skipped"):
        lines.append(f"skipped: {m['skipped']:,} unreadable files (listed in {where / 'skipped.txt'})")
    if m.get("outside"):
        lines.append(f"left out: {len(m['outside']):,} images beside the class folders, in none")
    if not len(rows["train"]):               # e.g. one loose image: the test split took it
        raise source.empty_split("train", d["root"], len(cache.images))
    grid = where / "grid.png"
    fresh = why is None and grid.exists() and grid.stat().st_mtime >= (where / imagecache.MANIFEST).stat().st_mtime
    train = None if fresh and not cfg.grid else source.ImageRows(cache.images, rows["train"])
    return lines, train, (s.height, s.width, s.channels), grid


def standard_report(d):
    """Load a standard set's splits; returns (lines, training rows, image shape, default grid path)."""
    from ..data.sets import dataset_info, load_from_config
    info = dataset_info(d)
    loaded = dict(zip(("train", "val", "test"), load_from_config(d, ("train", "val", "test"), labels=True)))
    lines = [f"{info.name} in {d['root']}: {sum(len(x) for x, _ in loaded.values()):,} images of "
             f"{info.height}x{info.width}x{info.channels} ({info.length:,} sub-pixels each), "
             f"{sum(x.numel() for x, _ in loaded.values()):,} bytes as sequences",
             "splits: " + ", ".join(f"{k} {len(x):,}" for k, (x, _) in loaded.items())]
    lines += [f"{info.num_classes} classes:"] + class_table(info.class_names, {k: y.numpy() for k, (_, y) in
                                                                              loaded.items()})
    return lines, loaded["train"][0], (info.height, info.width, info.channels), Path(f"{info.name}-grid.png")


def prepare(cfg, device):
    from ..config import PrepareConfig, check_threads, plain, typed

    cfg = typed(PrepareConfig, cfg)
    check_threads(cfg.threads)
    d = {**plain(cfg.data), "workers": cfg.data.workers or cfg.threads}     # the data functions take a dict
    if cfg.grid_images < 0 or cfg.nrow < 1 or cfg.scale < 1:
        raise UserError("grid_images must be >= 0, nrow and scale >= 1.")
    if cfg.grid:
        check_target(cfg.grid, "grid")
        image_format(cfg.grid)              # an unknown suffix refused before any work
    if d["name"] == "folder":
        lines, train, shape, default_grid = folder_report(d, cfg)
    elif cfg.check:
        raise UserError(f"check=true applies to data=folder, whose cache is built; {d['name']} is read from its "
                        f"official files each run.")
    else:
        lines, train, shape, default_grid = standard_report(d)
    show(*lines)
    if cfg.check or not cfg.grid_images:
        return
    if train is None:
        show(f"grid of training images as the model sees them: {default_grid}")
        return
    from ..sampling.decode import grid
    n = min(cfg.grid_images, len(train))
    pick = np.sort(np.random.default_rng(0).choice(len(train), n, replace=False))
    images = train[pick].numpy().reshape(n, *shape)
    out = Path(cfg.grid) if cfg.grid else default_grid
    picture = grid(images, nrow=cfg.nrow, scale=cfg.scale)
    ours = d["name"] == "folder" and not cfg.grid       # grid.png inside the cache folder imagegen built
    write_owned(out, encode_image(picture, image_format(out, picture.mode)), "grid", cfg.overwrite or ours)
    show(f"wrote {out} ({n} training images as the model sees them)")


_main = hydra_entry("prepare", prepare)


def main():
    """imagegen-data VERB [key=value ...]; the one verb is prepare."""
    args = sys.argv[1:]
    if args and args[0] in ("--help", "-h"):
        args = ["prepare"] + args
    if not args or args[0] not in VERBS:
        got = f" (got {args[0]!r})" if args else ""
        sys.exit(f"error: imagegen-data needs a verb{got}: imagegen-data prepare data.root=DIR data.image_size=S; "
                 f"see imagegen-data prepare --help.")
    sys.argv = [sys.argv[0]] + args[1:]
    try:
        _main()
    except KeyboardInterrupt:                # in Hydra's own start-up: the same one line
        interrupted()


if __name__ == "__main__":
    main()
