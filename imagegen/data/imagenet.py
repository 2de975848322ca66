"""The downsampled ImageNet (Chrabaszcz, Loshchilov and Hutter 2017) at 32x32 and 64x64, as a cache.

The files need a registration, so imagegen never downloads them: get "Imagenet32x32" or
"Imagenet64x64" in the npz format from https://image-net.org/download-images.php and unzip them
anywhere under data.root (one root per size):
  train_data_batch_1.npz .. train_data_batch_10.npz   data: N x 3*S*S uint8, channel-planar (all R,
                                                      then G, then B); labels: 1..1000
  val_data.npz                                        the test split here, as in the papers
They are converted once into the cache an image folder gets (imagegen/data/imagecache.py): rows in raster
order with r, g, b per pixel, labels 0..999. Each file's `data` is read from the zip in chunks of
rows, so the conversion's memory does not grow with the files (1.28 million 64x64 images: 15.7 GB).
"""
import os
import re
import time
import zipfile
from pathlib import Path

import numpy as np

from . import folder, imagecache
from .catalogue import IMAGENET_CLASSES
from ..errors import UserError
from ..say import show

SIZES = {"imagenet32": 32, "imagenet64": 64}
WHERE = ("get the npz files from https://image-net.org/download-images.php (Downsampled ImageNet, a free "
         "registration) and unzip them into {root}")
_BATCH = re.compile(r"^train_data_batch_(\d+)\.npz$")
_CHUNK_ROWS = 2048


def settings(name):
    s = SIZES[name]
    return imagecache.Settings(s, s, 3, "native", 0)


def scan(root):
    """folder.Scan of the npz files under root: train_data_batch_*.npz (split train, in batch order)
    and val_data.npz (split test)."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"data.root {root} is not a folder; {WHERE.format(root='a folder')} and point data.root "
                        f"at it.")
    found = []
    for path in root.rglob("*.npz"):
        if ".imagegen-cache" in path.parts:
            continue
        m = _BATCH.match(path.name)
        if m or path.name == "val_data.npz":
            st = path.stat()
            key = (0, int(m.group(1))) if m else (1, 0)
            found.append((key, folder.Entry(path.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns,
                                            "train" if m else "test")))
    splits = {e.split for _, e in found}
    if splits != {"train", "test"}:
        lacking = " and ".join(f for s, f in (("train", "train_data_batch_*.npz"), ("test", "val_data.npz"))
                               if s not in splits)
        raise UserError(f"the downsampled ImageNet's {lacking} not found under {root}; "
                        f"{WHERE.format(root=root)}.")
    return folder.Scan(tuple(e for _, e in sorted(found)), IMAGENET_CLASSES, ())


def _member(zf, name, path):
    """(open stream positioned at the data, shape, dtype) of the array `name` inside an npz."""
    try:
        f = zf.open(name + ".npy")
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                 else np.lib.format.read_array_header_2_0)(f)
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as e:
        raise UserError(f"{path} holds no readable '{name}' array ({e}); it is not a downsampled ImageNet file, "
                        f"download it again.") from None
    if fortran:
        raise UserError(f"{path} stores '{name}' in Fortran order, which the downsampled ImageNet never does; "
                        f"download it again.")
    return f, shape, dtype


def read_npz(path, size):
    """(labels (N,) int64 in 0..999, a generator of uint8 row chunks (B, 3*S*S) in raster order) of one file."""
    D = 3 * size * size
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise UserError(f"{path} is not a readable npz file ({e}); download it again.") from None
    f, shape, dtype = _member(zf, "labels", path)
    if len(shape) != 1 or dtype.kind not in "iu":
        raise UserError(f"{path} holds labels of shape {shape} and dtype {dtype}, not N integers; download it again.")
    labels = np.frombuffer(f.read(shape[0] * dtype.itemsize), dtype).astype(np.int64)
    if len(labels) != shape[0] or labels.min(initial=1) < 1 or labels.max(initial=1) > 1000:
        raise UserError(f"{path} holds labels outside 1..1000 (or fewer than it says); download it again.")
    f, shape, dtype = _member(zf, "data", path)
    if shape != (len(labels), D) or dtype != np.uint8:
        raise UserError(f"{path} holds data of shape {shape} and dtype {dtype}, not {len(labels)} x {D} uint8: it is "
                        f"not the {size}x{size} downsampled ImageNet (data=imagenet{size}); point data.root at the "
                        f"right files.")

    def chunks():
        with zf, f:
            for start in range(0, shape[0], _CHUNK_ROWS):
                n = min(_CHUNK_ROWS, shape[0] - start)
                raw = f.read(n * D)
                if len(raw) < n * D:
                    raise UserError(f"{path} is truncated (its data ends before row {start + len(raw) // D}); "
                                    f"download it again.")
                planar = np.frombuffer(raw, np.uint8).reshape(n, 3, size * size)
                yield planar.transpose(0, 2, 1).reshape(n, D)       # R(SS) G(SS) B(SS) -> r, g, b per pixel
    return labels - 1, chunks()


def build(root, cache_dir, settings, scan, workers=0, progress=True, say=show):
    """Convert the npz files of `scan` into a new cache in cache_dir (the caller holds its lock)."""
    from tqdm import tqdm
    root, cache_dir = Path(root), Path(cache_dir)
    names = imagecache.new_names()
    start = time.perf_counter()
    out = imagecache.RowFile(cache_dir, names["images"], settings.length)
    labels, splits = [], []
    try:
        for entry in scan.entries:
            y, chunks = read_npz(root / entry.path, settings.height)
            with tqdm(total=len(y), unit="img", desc=os.path.basename(entry.path), disable=not progress,
                      mininterval=0.5) as bar:
                for rows in chunks:
                    out.append(rows)
                    bar.update(len(rows))
            labels.append(y)
            splits.append(np.full(len(y), imagecache.SPLIT_CODE[entry.split]))
    except BaseException:
        out.discard()
        raise
    out.finish()
    seconds = time.perf_counter() - start
    manifest = {"root": str(root), "settings": vars(settings), "versions": imagecache._versions(),
                "rows": out.rows, "class_names": list(scan.class_names), "outside": [], "skipped": 0,
                "seconds": round(seconds, 3), "workers": 1,
                "files": [[e.path, e.size, e.mtime_ns] for e in scan.entries]}
    imagecache.commit(cache_dir, names, np.concatenate(labels), np.concatenate(splits), manifest)
    say(f"converted {out.rows} images from {len(scan.entries)} npz files under {root} in {seconds:.1f} s into "
        f"{cache_dir}")
    return {"format": 1, **names, **manifest}
