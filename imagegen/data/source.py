"""A folder of images (or the downsampled ImageNet) as a dataset: its DatasetInfo, its splits, rows
read from the memory-mapped cache.

`data=folder` config keys (conf/data/folder.yaml): root, image_size (or height and width),
channels (1 or 3), fit (crop or pad), background, cache, workers, val_fraction, test_fraction,
split_seed. Splits: test/ and val/ folders when the folder has them (a val/ folder with no test/
beside it serves as both, ImageNet's habit); otherwise a seeded `test_fraction` of the images is
the test split and a seeded `val_fraction` of the rest the validation split, like MNIST's.

Everything downstream reads an `ImageRows`: x[idx] (a slice, an int array or tensor) gives a uint8
tensor (B, D) read from the map, so a process never holds more than the rows it asked for.
"""
import hashlib
import os
from pathlib import Path

import numpy as np

from . import imagecache, imagenet
from .catalogue import DatasetInfo
from ..errors import UserError
from ..say import show


class ImageRows:
    """Rows of a uint8 (N, D) array (a memory map), optionally through an index (B,) into it.

    len(x), x.shape, x.numel() and x[key] (key a slice, an int, an int array or tensor, or a
    (rows, columns) pair) as for a tensor; x[key] reads just those rows into a new uint8 tensor."""

    def __init__(self, array, index=None):
        self.array, self.index = array, None if index is None else np.asarray(index, np.int64)

    def __len__(self):
        return len(self.array) if self.index is None else len(self.index)

    @property
    def shape(self):
        import torch
        return torch.Size((len(self), self.array.shape[1]))

    def numel(self):
        return len(self) * self.array.shape[1]

    def __getitem__(self, key):
        import torch
        if isinstance(key, tuple):
            return self[key[0]][(slice(None),) + key[1:]]
        if isinstance(key, torch.Tensor):
            key = key.cpu().numpy()
        if isinstance(key, slice):
            rows = np.arange(len(self))[key]
        else:
            rows = np.asarray(key, dtype=np.int64)
            if rows.ndim == 0:
                return self[rows.reshape(1)][0]
            rows = np.where(rows < 0, rows + len(self), rows)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"row index out of range for {len(self)} rows")
        rows = rows if self.index is None else self.index[rows]
        if len(rows) > 1 and np.all(np.diff(rows) == 1):    # contiguous: one read
            out = np.array(self.array[rows[0]: rows[-1] + 1])
        else:
            out = np.empty((len(rows), self.array.shape[1]), np.uint8)
            np.take(self.array, rows, axis=0, out=out)
        return torch.from_numpy(out)


# ---------------------------------------------------------------- config
MAX_SIDE = 1024      # pixels a side: a sequence of up to 3,145,728 sub-pixels (the shipped models read 784 and 3,072)


def settings(d):
    """imagecache.Settings of a folder data config, every value checked (one sentence each)."""
    size, h, w = d.get("image_size"), d.get("height"), d.get("width")
    if size is not None and (h is not None or w is not None):
        raise UserError("give data.image_size=S (square images) or data.height and data.width, not both.")
    if size is not None:
        h = w = size
    if h is None or w is None:
        raise UserError("data=folder needs the size of the images: data.image_size=S (e.g. 32), or data.height "
                        "and data.width.")
    for key, v in (("height", h), ("width", w)):
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_SIDE:
            raise UserError(f"data.{'image_size' if size is not None else key} must be a whole number of pixels "
                            f"from 1 to {MAX_SIDE}, got {v!r}; a pixel transformer reads an image as one sequence "
                            f"of height x width x channels bytes (32: 3,072), so pass e.g. data.image_size=32.")
    channels = d.get("channels", 3)
    if channels not in (1, 3):
        raise UserError(f"data.channels must be 1 (grey) or 3 (colour), got {channels!r}.")
    fit = d.get("fit", "crop")
    if fit not in ("crop", "pad"):
        raise UserError(f"data.fit must be crop (resize the shorter side, cut the centre) or pad (resize the "
                        f"longer side, pad with data.background), got {fit!r}.")
    background = d.get("background", 255)
    if not isinstance(background, int) or not 0 <= background <= 255:
        raise UserError(f"data.background must be a grey level 0..255, got {background!r}.")
    return imagecache.Settings(h, w, channels, fit, background)


def cache_dir(d):
    """data.cache, else <root>/.imagegen-cache when the root is writable, else a folder under
    ~/.cache/imagegen named after the root."""
    if d.get("cache"):
        return Path(d["cache"]).expanduser().resolve()
    root = Path(d["root"]).expanduser().resolve()
    if os.access(root, os.W_OK):
        return root / ".imagegen-cache"
    home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "imagegen"
    return home / f"{root.name}-{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"


def open_cache(d, progress=True, say=show, check_only=False):
    """(imagecache.Cache or None, why out of date or None) of a folder (or downsampled ImageNet) data
    config; see imagecache.ensure."""
    if not d.get("root") or str(d["root"]).endswith("???"):
        raise UserError(f"data={d['name']} needs the folder: data.root=DIR.")
    root, workers = Path(d["root"]).expanduser(), d.get("workers", 0) or 0
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        raise UserError(f"data.workers must be >= 0 (0: one process per core), got {workers!r}.")
    if workers > imagecache.default_workers():          # more processes than cores only wait for each other
        cores = imagecache.default_workers()
        say(f"data.workers={workers}, but this process may run on {cores} core{'s' * (cores != 1)}: {cores} "
            f"worker{'s' * (cores != 1)}")
        workers = cores
    if d["name"] in imagenet.SIZES:
        return imagecache.ensure(root, cache_dir(d), imagenet.settings(d["name"]), workers, progress, say, check_only,
                                 scan_fn=imagenet.scan, build_fn=imagenet.build)
    return imagecache.ensure(root, cache_dir(d), settings(d), workers, progress, say, check_only)


def folder_info(d):
    """DatasetInfo of a folder data config: size and channels from the config, class names from the
    config's class_names when recorded, else from the cache's manifest, else none."""
    s = settings(d)
    names = d.get("class_names")
    if names is None and d.get("root"):
        manifest = imagecache.read_manifest(cache_dir(d))
        names = manifest.get("class_names") if manifest else None
    return DatasetInfo("folder", s.height, s.width, s.channels, tuple(names or ()))


# ---------------------------------------------------------------- splits
def split_rows(split_codes, splits, val_fraction, test_fraction, seed):
    """{split: sorted row indices} for splits among train, val, test (see the module's docstring)."""
    code = imagecache.SPLIT_CODE
    rows = {name: np.flatnonzero(split_codes == code[name]) for name in ("train", "val", "test")}
    pool = np.flatnonzero(split_codes == code[None])
    if len(pool):                                         # no split folders: seeded held-out shares
        perm = np.random.default_rng(seed).permutation(pool)
        n_test = max(1, round(len(pool) * test_fraction)) if test_fraction > 0 else 0
        rows["test"], pool = np.sort(perm[:n_test]), perm[n_test:]
        rows["train"] = pool
    elif not len(rows["test"]):                           # train/ and val/ only: val/ is the test split too
        rows["test"] = rows["val"]
    if not len(rows["val"]) or len(pool):                 # val: a seeded share of the training images
        train = rows["train"]
        perm = np.random.default_rng(seed).permutation(train)
        n_val = max(1, round(len(train) * val_fraction)) if val_fraction > 0 else 0
        rows["val"], rows["train"] = np.sort(perm[:n_val]), np.sort(perm[n_val:])
    return {s: rows[s] for s in splits}


def empty_split(split, root, images):
    """The UserError for a folder whose `split` holds no image (images: how many the folder has)."""
    return UserError(f"the {split} split of {root} is empty ({images} image{'s' * (images != 1)} in all); add "
                     f"images (a {split}/ folder, or more images for data.val_fraction and data.test_fraction to "
                     f"take from).")


def load(d, splits, labels=False, progress=True, say=show):
    """[ImageRows of each split] (or [(ImageRows, labels (B,) int64 tensor)] with labels=True) of a
    folder data config, converting the folder first when its cache is missing or out of date."""
    import torch
    for split in splits:
        if split not in ("train", "val", "test"):
            raise UserError(f"unknown split {split!r}; choose train, val or test.")
    test_fraction = d.get("test_fraction", 0.1)
    if d["name"] in imagenet.SIZES and d.get("download"):
        raise UserError(f"{d['name']} cannot be downloaded here (it needs a registration): "
                        f"{imagenet.WHERE.format(root=d['root'])}, and pass data.download=false.")
    if not 0 <= test_fraction < 1:
        raise UserError(f"data.test_fraction must be at least 0 and below 1, got {test_fraction}.")
    cache, _ = open_cache(d, progress=progress, say=say)
    chosen = split_rows(cache.splits, splits, d.get("val_fraction", 0.05), test_fraction, d.get("split_seed", 0))
    out = []
    for split in splits:
        idx = chosen[split]
        if len(idx) == 0:
            raise empty_split(split, d["root"], len(cache.images))
        x = ImageRows(cache.images, idx)
        out.append((x, torch.from_numpy(cache.labels[idx].copy())) if labels else x)
    return out
