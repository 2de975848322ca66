"""First-run download of a standard set's official files: each through a temporary file, checked by its
md5 before a reader can see it; a CIFAR archive's members unpacked through a temporary folder.
"""
import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from . import catalogue
from .official import OFFICIAL, check_root, holds_other, missing_files, near_miss
from ..errors import UserError
from ..say import show

try:
    import fcntl
except ImportError:  # Windows: no flock; dead .part files stay
    fcntl = None

MAX_DOWNLOAD = 256 << 20             # bytes; every official file is smaller
MAX_MEMBER = 256 << 20               # bytes; every file in the official CIFAR archives is smaller (the largest,
                                     # CIFAR-100's train, holds 153.6 MB of pixels)
_CHUNK = 1 << 20


def _md5(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _base_url(official, mirror):
    base = mirror or official
    return base if base.endswith("/") else base + "/"


def _lock_part(fd):
    """A duplicate of a download's .part fd holding an flock on it until the file is renamed or
    removed (released when its process dies, so that the next download knows the file is dead)."""
    lock = os.dup(fd)
    if fcntl is not None:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return lock


def remove_dead_parts(dest):
    """Remove the .part files of dest's earlier downloads whose process died (kill -9, power loss):
    a .part file nobody holds an flock on. A download still running elsewhere keeps its file."""
    if fcntl is None:
        return
    for part in Path(dest).parent.glob(f".{Path(dest).name}.*.part"):
        try:
            fd = os.open(part, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            part.unlink()
        except OSError:
            pass                           # held by a live download (BlockingIOError), or already gone
        finally:
            os.close(fd)


def _fetch(url, dest, md5, what, root, urls, unpack=False):
    """Download url to dest through a unique temporary file in dest's folder, renamed only once its
    md5 matches; on any failure the temporary file is removed and nothing is left at dest.
    what, root, urls, unpack: the dataset, data.root, every URL still missing and whether it is an
    archive, for the error sentences."""
    from tqdm import tqdm
    by_hand = (f"download {' '.join(urls)} by hand into {dest.parent}{' and unpack it there' if unpack else ''}, "
               f"or point data.root at a folder holding {'its contents' if unpack else 'them'}")
    remove_dead_parts(dest)
    try:
        response = urllib.request.urlopen(url, timeout=60)
    except (OSError, ValueError) as e:  # URLError/HTTPError (offline, refused, 404), timeouts, a malformed URL
        reason = f"HTTP {e.code} {e.reason}" if isinstance(e, urllib.error.HTTPError) else getattr(e, "reason", e)
        raise UserError(f"{what} not found in {root} and {url} could not be downloaded ({reason}); "
                        f"{by_hand}.") from None
    tmp = lock = None
    try:
        with response:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
            lock = _lock_part(fd)
            total = int(response.headers.get("Content-Length") or 0) or None
            got = 0
            with os.fdopen(fd, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=dest.name) as bar:
                while block := response.read(1 << 16):
                    got += len(block)
                    if got > MAX_DOWNLOAD:
                        raise UserError(f"{url} sends more than {MAX_DOWNLOAD} bytes, more than the official "
                                        f"file (nothing was kept); check the mirror, or {by_hand}.")
                    out.write(block)
                    bar.update(len(block))
        if total is not None and got != total:
            raise UserError(f"the download of {url} was cut after {got} of {total} bytes (nothing was kept); "
                            f"run again to retry, or {by_hand}.")
        if _md5(tmp) != md5:
            raise UserError(f"{url} downloaded with a wrong md5 checksum (nothing was kept); run again to retry, "
                            f"check the mirror, or {by_hand}.")
        os.replace(tmp, dest)
        tmp = None
    except (OSError, ValueError) as e:  # a connection reset or timeout mid-transfer, a full disk
        raise UserError(f"the download of {url} into {dest.parent} failed ({e}; nothing was kept); run again "
                        f"to retry, or {by_hand}.") from None
    finally:
        if tmp is not None:
            os.unlink(tmp)
        if lock is not None:
            os.close(lock)


def _extract(spec, archive, root):
    """Unpack the (checksummed) archive's members that spec keeps into root/<spec.folder>, each file
    through a temporary folder and a rename, never overwriting a file already there."""
    folder = Path(root) / spec.folder
    folder.mkdir(parents=True, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(dir=folder, prefix=".extract.")
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar.getmembers():
                name = member.name.removeprefix(spec.folder + "/")
                if name in spec.keep and member.isfile() and member.size <= MAX_MEMBER:
                    member.name = name
                    tar.extract(member, tmp_dir, filter="data")
        for name in spec.keep:
            if os.path.exists(Path(tmp_dir) / name) and not os.path.exists(folder / name):
                os.replace(Path(tmp_dir) / name, folder / name)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise UserError(f"could not unpack {archive} into {folder} ({e}); delete it and run again.") from None
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def download(name, root, mirror=None, splits=("train", "test")):
    """Fetch the official files that the given splits need and that are missing under root,
    each checked by its md5 before a reader can see it. mirror (data.mirror) replaces
    the official base URL; it must hold the files under their official names."""
    catalogue.info(name)
    check_root(root)
    root = Path(root)
    train_files = sorted({split != "test" for split in splits})
    near = near_miss(name, root)                                # root one folder off: the files are there
    where = f"{root}{f' (did you mean data.root={near}?)' if near is not None else holds_other(name, root)}"
    if where != str(root):
        show(f"note: data.root {where}: {name} is fetched into it; pass data.root=... naming the {name} "
              f"folder if that is not what you want.")
    spec = OFFICIAL[name]
    base = _base_url(spec.url, mirror)
    missing = list(dict.fromkeys(f for t in train_files for f in missing_files(name, root, t)))
    for i, fname in enumerate(missing):
        dest = root / spec.folder / fname if spec.idx else root / fname    # a CIFAR set's archive: unpacked below
        if not (os.path.exists(dest) and _md5(dest) == spec.md5[fname]):   # (an archive an earlier run left)
            _fetch(base + fname, dest, spec.md5[fname], spec.title, where, [base + f for f in missing[i:]],
                   unpack=not spec.idx)
        if not spec.idx:
            _extract(spec, dest, root)
            os.unlink(dest)
