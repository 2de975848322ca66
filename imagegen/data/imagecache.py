"""The converted form of an image folder: a build product read as a memory map.

A cache folder holds
  manifest.json           what was converted: settings, code and Pillow versions, every candidate
                          file (path, size, mtime), the class names, and the names of the two files below
  images-<id>.npy         uint8 (N, D): one row per readable image, D = H*W*C sub-pixels in raster
                          order (channels interleaved per pixel), opened with np.load(mmap_mode="r")
  meta-<id>.npy           int64 (N, 2): each row's label (-1: unlabelled) and split folder (0 train,
                          1 val, 2 test, -1 none)
  skipped.txt             the files that could not be read, one per line with the reason
Every file is written under a temporary name, fsynced and renamed; manifest.json goes last and is
the only thing a reader trusts, so a conversion killed at any moment leaves either the old cache
or none, never half of one. Builders take an flock on the folder; a second one waits, then finds
the cache built. The cache is reused while the folder's files (paths, sizes, mtimes), the settings
and the conversion code are as the manifest says; otherwise it is rebuilt, with one line saying why.
"""
import io
import json
import multiprocessing
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import folder
from ..files import fsync_folder
from ..errors import UserError
from ..say import show
from ..lock import exclusive

CONVERSION_VERSION = 1          # raise when read_image's output changes for the same file and settings
MANIFEST = "manifest.json"
SPLIT_CODE = {None: -1, "train": 0, "val": 1, "test": 2}
HEADER_BYTES = 128              # the .npy header is written at this fixed size, rewritten once N is known


@dataclass(frozen=True)
class Settings:
    height: int
    width: int
    channels: int
    fit: str = "crop"
    background: int = 255

    @property
    def length(self):
        return self.height * self.width * self.channels


@dataclass
class Cache:
    """An opened cache: images (N, D) uint8 memory map, labels (N,) int64 (-1: none), splits (N,) int8
    split-folder codes, class names, and the manifest."""
    folder: Path
    images: np.ndarray
    labels: np.ndarray
    splits: np.ndarray
    class_names: tuple
    manifest: dict


def _versions():
    import PIL
    return {"code": CONVERSION_VERSION, "pillow": PIL.__version__}


def _atomic_write(path, data):
    """Write bytes to path through a temporary file in the same folder, fsynced, then renamed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _npy_header(shape, dtype):
    """A version 1.0 .npy header of exactly HEADER_BYTES bytes."""
    text = repr({"descr": np.dtype(dtype).str, "fortran_order": False, "shape": tuple(shape)})
    body = text.encode("latin1")
    pad = HEADER_BYTES - 10 - len(body) - 1
    return b"\x93NUMPY\x01\x00" + (HEADER_BYTES - 10).to_bytes(2, "little") + body + b" " * pad + b"\n"


def read_manifest(cache_dir):
    try:
        with open(Path(cache_dir) / MANIFEST) as f:
            m = json.load(f)
        return m if isinstance(m, dict) and m.get("format") == 1 else None
    except (OSError, ValueError):
        return None


def what_changed(manifest, settings, scan):
    """One phrase saying why the cache no longer fits (None: it fits)."""
    if manifest is None:
        return None
    old = manifest.get("settings", {})
    now = vars(settings)
    diffs = [f"data.{k} {old.get(k)} -> {v}" for k, v in now.items() if old.get(k) != v]
    versions = _versions()
    if manifest.get("versions") != versions:
        diffs.append(f"conversion code {manifest.get('versions')} -> {versions}")
    before = {f[0]: tuple(f[1:3]) for f in manifest.get("files", [])}
    after = {e.path: (e.size, e.mtime_ns) for e in scan.entries}
    for what, paths in (("added", [p for p in after if p not in before]),
                        ("removed", [p for p in before if p not in after]),
                        ("changed", [p for p in after if p in before and before[p] != after[p]])):
        if paths:
            diffs.append(f"{len(paths)} file{'s' * (len(paths) > 1)} {what} ({', '.join(paths[:3])}"
                         f"{', ...' if len(paths) > 3 else ''})")
    if not diffs and manifest.get("outside") != list(scan.outside):
        diffs.append("images outside the class folders changed")
    return "; ".join(diffs) or None


def _open(cache_dir, manifest, settings):
    """The Cache a manifest describes, or None when its files are missing or do not match it."""
    try:
        images = np.load(cache_dir / manifest["images"], mmap_mode="r")
        meta = np.load(cache_dir / manifest["meta"], allow_pickle=False)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    n = manifest.get("rows")
    if images.dtype != np.uint8 or images.shape != (n, settings.length) or meta.shape != (n, 2):
        return None
    return Cache(cache_dir, images, meta[:, 0].copy(), meta[:, 1].astype(np.int8), tuple(manifest["class_names"]),
                 manifest)


def check_convert_fits(settings, workers):
    """UserError, before any file is read, when `workers` conversions at once would not fit in 80% of the free
    memory: each holds a decoded image, its float resize and its row, about 16 bytes per sub-pixel (a size that
    does not fit would otherwise fail every file with MemoryError, blaming good files)."""
    from ..tuning.machine import available_bytes
    import torch

    need, free = 16 * settings.length * workers, 0.8 * available_bytes(torch.device("cpu"))
    if need > free:
        raise UserError(f"converting images of {settings.height}x{settings.width}x{settings.channels} with {workers} "
                        f"worker(s) would need about {need / 2**20:,.0f} MiB, more than the {free / 2**20:,.0f} MiB of "
                        f"free memory; pass a smaller data.image_size (or data.height and data.width).")


def default_workers():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _jobs(root, entries, settings):
    s = settings
    return [(os.path.join(root, e.path), s.height, s.width, s.channels, s.fit, s.background) for e in entries]


def _convert_all(jobs, workers, progress):
    """Yields (row bytes or None, why) per job, in order, converted by `workers` processes, with a
    progress bar (count, rate and ETA) when progress is on."""
    from tqdm import tqdm
    bar = tqdm(total=len(jobs), unit="img", desc="converting", dynamic_ncols=True, disable=not progress,
               mininterval=0.5)
    if workers <= 1 or len(jobs) < 2:
        results = map(folder.convert, jobs)
        pool = None
    else:
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
        pool = ctx.Pool(min(workers, len(jobs)))
        results = pool.imap(folder.convert, jobs, chunksize=max(1, min(64, len(jobs) // (8 * workers))))
    try:
        for r in results:
            bar.update(1)
            yield r
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()


class RowFile:
    """uint8 rows of D sub-pixels appended to a temporary .npy by pwrite (no map, so memory stays
    flat), its header written once the count is known; `finish` renames it to its final name."""

    def __init__(self, cache_dir, name, length):
        self.path, self.tmp, self.length, self.rows = cache_dir / name, cache_dir / f".{name}.tmp", length, 0
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.pwrite(self.fd, _npy_header((0, length), np.uint8), 0)

    def append(self, rows):
        """rows: bytes of whole rows, or a uint8 array (B, D)."""
        data = rows if isinstance(rows, bytes) else np.ascontiguousarray(rows, np.uint8).tobytes()
        os.pwrite(self.fd, data, HEADER_BYTES + self.rows * self.length)
        self.rows += len(data) // self.length

    def finish(self):
        os.pwrite(self.fd, _npy_header((self.rows, self.length), np.uint8), 0)
        os.ftruncate(self.fd, HEADER_BYTES + self.rows * self.length)
        os.fsync(self.fd)
        os.close(self.fd)
        os.replace(self.tmp, self.path)

    def discard(self):
        os.close(self.fd)
        self.tmp.unlink(missing_ok=True)


def commit(cache_dir, names, labels, splits, manifest):
    """Write meta-<id>.npy (labels, split codes) and then manifest.json, each by temp + rename, and
    remove earlier builds' files; images-<id>.npy is already in place."""
    meta = np.stack([np.asarray(labels, np.int64), np.asarray(splits, np.int64)], axis=1).reshape(-1, 2)
    buf = io.BytesIO()
    np.save(buf, meta)
    _atomic_write(cache_dir / names["meta"], buf.getvalue())
    _atomic_write(cache_dir / MANIFEST, json.dumps({"format": 1, **names, **manifest}).encode())
    fsync_folder(cache_dir)
    for old in cache_dir.glob("*-*.npy"):                   # earlier builds' files (open maps keep theirs)
        if old.name not in names.values():
            old.unlink(missing_ok=True)


def new_names():
    token = secrets.token_hex(4)
    return {"images": f"images-{token}.npy", "meta": f"meta-{token}.npy"}


def build(root, cache_dir, settings, scan, workers=0, progress=True, say=show):
    """Convert every candidate of `scan` into a new cache in cache_dir (the caller holds its lock)."""
    root, cache_dir = Path(root), Path(cache_dir)
    workers = workers or default_workers()
    check_convert_fits(settings, workers)
    names = new_names()
    start = time.perf_counter()
    entries = scan.entries
    class_index = {c: i for i, c in enumerate(scan.class_names)}
    kept, skipped = [], []
    out = RowFile(cache_dir, names["images"], settings.length)
    try:
        for entry, (row, why) in zip(entries, _convert_all(_jobs(root, entries, settings), workers, progress)):
            if row is None:
                skipped.append((entry.path, why))
            else:
                out.append(row)
                kept.append(entry)
    except BaseException:
        out.discard()
        raise
    seconds = time.perf_counter() - start
    _write_skipped(cache_dir, skipped)
    if not kept:
        out.discard()
        if not entries:
            suffixes = ", ".join(sorted(folder.image_suffixes())[:8])
            raise UserError(f"no image files under {root} (Pillow reads {suffixes}"
                            f", ...); point data.root at a folder of images.")
        raise UserError(f"none of the {len(entries)} image files under {root} could be read (each is listed with its "
                        f"reason in {cache_dir / 'skipped.txt'}); point data.root at a folder of readable images.")
    out.finish()
    manifest = {"root": str(root), "settings": vars(settings), "versions": _versions(), "rows": len(kept),
                "class_names": list(scan.class_names), "outside": list(scan.outside), "skipped": len(skipped),
                "seconds": round(seconds, 3), "workers": workers,
                "files": [[e.path, e.size, e.mtime_ns] for e in entries]}
    commit(cache_dir, names, [class_index.get(e.cls, -1) for e in kept], [SPLIT_CODE[e.split] for e in kept],
           manifest)
    say(f"converted {len(kept)} images from {root} in {seconds:.1f} s ({len(entries) / max(seconds, 1e-9):.0f} "
        f"files/s, {workers} worker{'s' * (workers > 1)}) into {cache_dir}"
        + (f"; {len(skipped)} unreadable file{'s' * (len(skipped) > 1)} skipped (listed in "
           f"{cache_dir / 'skipped.txt'})" if skipped else ""))
    return {"format": 1, **names, **manifest}


def _write_skipped(cache_dir, skipped):
    path = Path(cache_dir) / "skipped.txt"
    if skipped:
        _atomic_write(path, "".join(f"{p}\t{why}\n" for p, why in skipped).encode("utf-8", "surrogateescape"))
    else:
        path.unlink(missing_ok=True)


def ensure(root, cache_dir, settings, workers=0, progress=True, say=show, check_only=False, scan_fn=None,
           build_fn=None):
    """(Cache of folder `root` in cache_dir, why it was out of date or None): converted first when
    missing or out of date (one line says why). check_only: never build (Cache None when out of date).
    scan_fn(root) -> folder.Scan and build_fn (as `build`) replace the image folder's for other sources
    (imagegen/data/imagenet.py)."""
    root, cache_dir = Path(root), Path(cache_dir)
    scan = (scan_fn or folder.scan)(root)
    manifest = read_manifest(cache_dir)
    why = what_changed(manifest, settings, scan) if manifest else "no cache yet"
    cache = _open(cache_dir, manifest, settings) if manifest and why is None else None
    if cache is None and why is None:
        why = "its files are missing or damaged"
    if check_only or cache is not None:
        return cache, why
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot make the cache folder {cache_dir} ({e.strerror or e}); set data.cache to a "
                        f"writable folder.") from None

    def wait(owner):
        say(f"waiting for another process (pid {owner.get('pid', '?')} on {owner.get('host', '?')}) that is "
            f"converting {root} into {cache_dir}")
    with exclusive(cache_dir / ".lock", wait):
        for tmp in cache_dir.glob(".*.tmp"):                # a killed builder's leftovers; we hold the lock
            tmp.unlink(missing_ok=True)
        manifest = read_manifest(cache_dir)               # another process may have built it meanwhile
        if manifest and what_changed(manifest, settings, scan) is None:
            cache = _open(cache_dir, manifest, settings)
            if cache is not None:
                return cache, why
        if why != "no cache yet":
            say(f"rebuilding the cache {cache_dir}: {why}")
        if scan.outside:
            say(f"{len(scan.outside)} images lie beside the class folders of {root}, in none (e.g. "
                f"{scan.outside[0]}); they are left out")
        manifest = (build_fn or build)(root, cache_dir, settings, scan, workers, progress, say)
        return _open(cache_dir, manifest, settings), why
