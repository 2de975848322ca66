"""MNIST and CIFAR-10 readers of the standard files, first-run download, image <-> sequence.

MNIST: torchvision's layout `<root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`.
CIFAR-10: the python batches in `<root>/cifar-10-batches-py/` (any of data_batch_1..5, test_batch).
Images become uint8 sequences of D sub-pixels in raster order, channels interleaved per
pixel (CIFAR: r, g, b, r, g, b, ...): MNIST D = 784, CIFAR-10 D = 3072.

Reading a data file never runs code (the CIFAR pickles go through a restricted unpickler) and
never holds more than the file's header promises; every bad file is one UserError sentence.
"""
import gzip
import hashlib
import io
import os
import pickle
import pickletools
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import UserError
from .memory import available_bytes

try:
    import fcntl
except ImportError:  # Windows: no flock; dead .part files stay
    fcntl = None


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    height: int
    width: int
    channels: int
    class_names: tuple = ()

    @property
    def num_classes(self):
        return len(self.class_names)

    @property
    def length(self):  # D, the number of sub-pixels per image
        return self.height * self.width * self.channels


CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
IMAGENET_CLASSES = tuple(str(k) for k in range(1, 1001))      # the downsampled files' 1-based label numbers
DATASETS = {"mnist": DatasetInfo("mnist", 28, 28, 1, tuple(str(d) for d in range(10))),
            "cifar10": DatasetInfo("cifar10", 32, 32, 3, CIFAR10_CLASSES),
            "imagenet32": DatasetInfo("imagenet32", 32, 32, 3, IMAGENET_CLASSES),   # imagegen/imagenet.py
            "imagenet64": DatasetInfo("imagenet64", 64, 64, 3, IMAGENET_CLASSES)}
CACHED = ("folder", "imagenet32", "imagenet64")     # read from a memory-mapped cache (imagegen/source.py)

MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
MNIST_FILES = {  # file -> md5 of the official gzipped file
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/"
CIFAR_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR_MEMBERS = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta", "readme.html"]
MIRROR_ENV = "IMAGEGEN_DATA_MIRROR"  # base URL holding the official files, used when data.mirror is null
MAX_DOWNLOAD = 256 << 20             # bytes; every official file is smaller
MAX_MEMBER = 64 << 20                # bytes; every file in the official CIFAR-10 archive is smaller
_CHUNK = 1 << 20


def dataset_info(name):
    """DatasetInfo of a dataset name (mnist, cifar10) or of a data config section (a dict): a folder's
    size and channels come from its config, its class names from the config or the folder's cache."""
    if isinstance(name, dict):
        if name.get("name") == "folder":
            from .source import folder_info
            return folder_info(name)
        name = name.get("name")
    if name not in DATASETS:
        raise UserError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS) + ['folder']} (data=mnist, "
                        f"data=cifar10, data=imagenet32, or data=folder data.root=DIR for a folder of images).")
    return DATASETS[name]


def _open(path):
    try:
        return open(path, "rb")
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror or e}); make it a readable file (check its permissions) "
                        f"or point data.root elsewhere.") from None


def _check_root(root):
    if os.path.exists(root) and not os.path.isdir(root):
        raise UserError(f"data.root {root} is a file, not a folder; point data.root at the folder holding the data.")


# ---------------------------------------------------------------- MNIST (IDX files)
def _read_upto(stream, n):
    """At most n bytes from stream, read in chunks (memory grows with what is there, not with n)."""
    buf = bytearray()
    while len(buf) < n:
        block = stream.read(min(_CHUNK, n - len(buf)))
        if not block:
            break
        buf += block
    return buf


def read_idx(path, expected_dims, item_shape=None):
    """Parse an IDX file (gzipped or not): big-endian header, magic 0x0000_08_<ndim>, uint8 data.

    The header's shape bounds what is read (a gzip stream that inflates further is refused, not
    inflated); item_shape (e.g. (28, 28)) is checked against the header before the data is read."""
    with _open(path) as f:
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        stream = gzip.GzipFile(fileobj=f, mode="rb") if gz else f
        try:
            return _parse_idx(path, stream, expected_dims, item_shape, None if gz else os.fstat(f.fileno()).st_size)
        except (OSError, EOFError, zlib.error) as e:
            if not gz:
                raise UserError(f"cannot read {path} ({e}); check the file and its disk.") from None
            raise UserError(f"{path} is a corrupt gzip file ({e}); delete it and download it again.") from None


def _parse_idx(path, stream, expected_dims, item_shape, file_size):
    magic = _read_upto(stream, 4)
    if len(magic) < 4 or magic[0:3] != b"\x00\x00\x08" or magic[3] != expected_dims:
        raise UserError(f"{path} is not an IDX uint8 file with {expected_dims} dimensions (bad magic number); "
                        f"replace it with the official MNIST file.")
    header = 4 + 4 * expected_dims
    dims = _read_upto(stream, header - 4)
    if len(dims) < header - 4:
        raise UserError(f"{path} is truncated inside its IDX header; download it again.")
    shape = tuple(int.from_bytes(dims[4 * i: 4 * i + 4], "big") for i in range(expected_dims))
    if item_shape is not None and shape[1:] != tuple(item_shape):
        raise UserError(f"{path} holds items of shape {shape[1:]}, not {tuple(item_shape)}; it is not MNIST.")
    size = int(np.prod(shape, dtype=object))
    if file_size is not None and file_size != header + size:
        raise UserError(f"{path} is truncated or padded: its header promises shape {shape} "
                        f"({header + size} bytes) but it holds {file_size} bytes; download it again.")
    if size > available_bytes(torch.device("cpu")):
        raise UserError(f"{path} promises shape {shape} ({size} bytes), more than the memory available; "
                        f"it is not an MNIST file, download it again.")
    raw = _read_upto(stream, size)
    if len(raw) < size or stream.read(1):
        what = "fewer" if len(raw) < size else "more"
        raise UserError(f"{path} is truncated or padded: its header promises shape {shape} ({size} data bytes) "
                        f"but it holds {what}; download it again.")
    return np.frombuffer(raw, dtype=np.uint8).reshape(shape)


def _find(raw_dir, stem):
    for name in (stem + ".gz", stem):
        if os.path.exists(raw_dir / name):
            return raw_dir / name
    return None


def _mnist_missing(root, train):
    raw_dir = Path(root) / "MNIST" / "raw"
    prefix = "train" if train else "t10k"
    return [f"{prefix}-{kind}-ubyte.gz" for kind in ("images-idx3", "labels-idx1")
            if _find(raw_dir, f"{prefix}-{kind}-ubyte") is None]


def load_mnist(root, train):
    _check_root(root)
    raw_dir = Path(root) / "MNIST" / "raw"
    missing = _mnist_missing(root, train)
    if missing:
        urls = " ".join(MNIST_URL + name for name in missing)
        raise UserError(f"MNIST not found: {', '.join(missing)} missing from {raw_dir} (gzipped or not)"
                        f"{holds_other('mnist', root)}; "
                        f"pass data.download=true to fetch them, or download {urls} into {raw_dir} by hand, "
                        f"or point data.root at the folder holding MNIST/raw.")
    prefix = "train" if train else "t10k"
    images_path = _find(raw_dir, f"{prefix}-images-idx3-ubyte")
    labels_path = _find(raw_dir, f"{prefix}-labels-idx1-ubyte")
    images = read_idx(images_path, 3, item_shape=(28, 28))
    labels = read_idx(labels_path, 1)
    if len(labels) != len(images):
        raise UserError(f"{labels_path} holds {len(labels)} labels but {images_path} holds {len(images)} images; "
                        f"the two files do not belong together.")
    return images.reshape(len(images), 784).copy(), labels.astype(np.int64)


# ---------------------------------------------------------------- CIFAR-10 (python batches)
_NDARRAY = object()  # stands for numpy.ndarray inside a pickle: named, never called
_RECONSTRUCT = np.empty(0).__reduce__()[0]  # numpy's array reconstruction (numpy.core or numpy._core)
_SCALAR = np.uint8(0).__reduce__()[0]
_FROMBUFFER = np.empty(0).__reduce_ex__(5)[0]  # protocol 5 re-pickles: an array over an in-band buffer


class _Dtype:
    """What numpy.dtype(...) in a pickle becomes: its type string and byte order, kept as plain data
    (numpy's own dtype.__setstate__ would take the file's flags on trust, and flags saying 'no
    objects' on an object dtype would let numpy read pointers from the file's bytes)."""

    def __init__(self, name, *args):
        self.name, self.order = name, "="

    def __setstate__(self, state):
        self.order = state[1] if isinstance(state, tuple) and len(state) > 1 else None


def _fresh(spec):
    """The numeric numpy dtype a pickled _Dtype names; anything else is refused."""
    dtype = np.dtype(spec.name) if isinstance(spec, _Dtype) and isinstance(spec.name, str) else None
    if dtype is None or dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None \
            or spec.order not in ("<", ">", "=", "|"):
        raise pickle.UnpicklingError(f"an array of dtype {getattr(spec, 'name', spec)!r}, not numbers")
    return dtype.newbyteorder(spec.order) if spec.order in "<>" else dtype


class _Array(np.ndarray):
    """What the pickle's array becomes: its state is checked (numbers only) before numpy takes it."""

    def __setstate__(self, state):
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise pickle.UnpicklingError("an array state numpy never writes")
        state = state[:-3] + (_fresh(state[-3]),) + state[-2:]
        super().__setstate__(state)


def _reconstruct(subtype, shape, dtype):
    """numpy's _reconstruct as numpy itself pickles it: an empty array that BUILD then fills."""
    if subtype is not _NDARRAY or shape != (0,):
        raise pickle.UnpicklingError("an array reconstruction numpy never writes")
    return _RECONSTRUCT(_Array, (0,), "b")


_ALLOWED = {  # every global the official CIFAR-10 python batches (and numpy 1 or 2 re-pickles) name
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.multiarray", "scalar"): lambda dtype, *args: _SCALAR(_fresh(dtype), *args),
    ("numpy._core.multiarray", "scalar"): lambda dtype, *args: _SCALAR(_fresh(dtype), *args),
    ("numpy.core.numeric", "_frombuffer"): lambda buf, dtype, *args: _FROMBUFFER(buf, _fresh(dtype), *args),
    ("numpy._core.numeric", "_frombuffer"): lambda buf, dtype, *args: _FROMBUFFER(buf, _fresh(dtype), *args),
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _Dtype,
}


class _CifarUnpickler(pickle.Unpickler):
    """Builds dicts, lists, strings, bytes, numbers and numpy arrays; refuses every other global."""

    def __init__(self, file, path):
        super().__init__(file, encoding="latin1")
        self.path = path

    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return _ALLOWED[module, name]
        raise UserError(f"{self.path} asks to load {module}.{name}, which no CIFAR-10 batch holds; it was refused "
                        f"without running anything (the file may be hostile): delete it and download it again.")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent ids")


def _unpickle(path):
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > available_bytes(torch.device("cpu")) // 2:
            raise UserError(f"{path} holds {size} bytes, more than a CIFAR-10 batch and than the memory "
                            f"available to read it; it is not CIFAR-10.")
        try:
            raw = f.read()
        except OSError as e:
            raise UserError(f"cannot read {path} ({e}); check the file and its disk.") from None
    try:
        for _ in pickletools.genops(io.BytesIO(raw)):  # every length field within the file, before allocating
            pass
        return _CifarUnpickler(io.BytesIO(raw), path).load()
    except UserError:
        raise
    except Exception as e:  # pickle raises many types on bad input
        why = f"{type(e).__name__}: {e}" if isinstance(e, pickle.UnpicklingError) else type(e).__name__
        raise UserError(f"{path} is not a readable CIFAR-10 python batch ({' '.join(why.split())[:160]}); "
                        f"download it again.") from None


def _is_label(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v < 10


def read_cifar_batch(path):
    """(uint8 sequences (B, 3072) in raster order, int64 labels (B,)) of one CIFAR-10 python batch."""
    batch = _unpickle(path)
    if not isinstance(batch, dict) or "data" not in batch or "labels" not in batch:
        raise UserError(f"{path} is not a CIFAR-10 batch (no 'data'/'labels' keys); download it again.")
    data, labels = batch["data"], batch["labels"]
    data = data.view(np.ndarray) if isinstance(data, np.ndarray) else data
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        desc = f"data of shape {data.shape} and dtype {data.dtype}" if isinstance(data, np.ndarray) else \
            f"data of type {type(data).__name__}"
        raise UserError(f"{path} holds {desc}, not N x 3072 uint8; it is not CIFAR-10.")
    if not isinstance(labels, list) or not all(_is_label(v) for v in labels):
        raise UserError(f"{path} holds labels that are not a list of integers 0..9; it is not CIFAR-10, "
                        f"download it again.")
    if len(labels) != len(data):
        raise UserError(f"{path} holds {len(data)} images but {len(labels)} labels; download it again.")
    # channel-planar R(1024) G(1024) B(1024) -> raster order with r, g, b interleaved per pixel
    seq = data.reshape(-1, 3, 1024).transpose(0, 2, 1).reshape(-1, 3072)
    return np.ascontiguousarray(seq), np.array(labels, dtype=np.int64).reshape(len(labels))


def _cifar_paths(root, train):
    folder = Path(root) / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
    return [folder / n for n in names if os.path.exists(folder / n)]


def _cifar_absent(root, train):
    return not _cifar_paths(root, train)


def load_cifar10(root, train):
    _check_root(root)
    folder = Path(root) / "cifar-10-batches-py"
    paths = _cifar_paths(root, train)
    if not paths:
        raise UserError(f"CIFAR-10 not found: expected {folder}/{'data_batch_1..5' if train else 'test_batch'}"
                        f"{holds_other('cifar10', root)}; "
                        f"pass data.download=true to fetch them, or download {CIFAR_URL + CIFAR_ARCHIVE} by hand "
                        f"and unpack it in {root}, or point data.root at the folder holding cifar-10-batches-py.")
    parts = [read_cifar_batch(p) for p in paths]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


# ---------------------------------------------------------------- download
def _md5(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _base_url(official, mirror):
    base = mirror or os.environ.get(MIRROR_ENV) or official
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


def _extract_cifar(archive, root):
    """Unpack the (checksummed) archive's batches into root/cifar-10-batches-py, each file through a
    temporary folder and a rename, never overwriting a file already there."""
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(dir=folder, prefix=".extract.")
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar.getmembers():
                name = member.name.removeprefix("cifar-10-batches-py/")
                if name in CIFAR_MEMBERS and member.isfile() and member.size <= MAX_MEMBER:
                    member.name = name
                    tar.extract(member, tmp_dir, filter="data")
        for name in CIFAR_MEMBERS:
            if os.path.exists(Path(tmp_dir) / name) and not os.path.exists(folder / name):
                os.replace(Path(tmp_dir) / name, folder / name)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise UserError(f"could not unpack {archive} into {folder} ({e}); delete it and run again.") from None
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def holds_other(name, root):
    """" (which holds MNIST files, not CIFAR-10)" when root holds the other dataset's files but none of
    `name`'s (a data.root pointing at the wrong dataset), else ""."""
    has = {"mnist": not all(_mnist_missing(root, t) for t in (True, False)),
           "cifar10": not all(_cifar_absent(root, t) for t in (True, False))}
    other = "cifar10" if name == "mnist" else "mnist"
    label = {"mnist": "MNIST", "cifar10": "CIFAR-10"}
    return f" (which holds {label[other]} files, not {label[name]})" if has[other] and not has[name] else ""


def download(name, root, mirror=None, splits=("train", "test")):
    """Fetch the official files that the given splits need and that are missing under root,
    each checked by its md5 before a reader can see it. mirror (or $IMAGEGEN_DATA_MIRROR) replaces
    the official base URL; it must hold the files under their official names."""
    dataset_info(name)
    _check_root(root)
    root = Path(root)
    train_files = sorted({split != "test" for split in splits})
    where = f"{root}{holds_other(name, root)}"                  # root as the error sentences name it
    if where != str(root):
        print(f"note: data.root {where}: {name} is fetched into it; pass data.root=... naming the {name} "
              f"folder if that is not what you want.")
    if name == "mnist":
        base = _base_url(MNIST_URL, mirror)
        missing = [f for t in train_files for f in _mnist_missing(root, t)]
        for i, fname in enumerate(missing):
            _fetch(base + fname, root / "MNIST" / "raw" / fname, MNIST_FILES[fname], "MNIST", where,
                   [base + f for f in missing[i:]])
    elif any(_cifar_absent(root, t) for t in train_files):
        archive = root / CIFAR_ARCHIVE
        if not (os.path.exists(archive) and _md5(archive) == CIFAR_MD5):
            url = _base_url(CIFAR_URL, mirror) + CIFAR_ARCHIVE
            _fetch(url, archive, CIFAR_MD5, "CIFAR-10", where, [url], unpack=True)
        _extract_cifar(archive, root)
        os.unlink(archive)


# ---------------------------------------------------------------- splits
def load_splits(name, root, splits, val_fraction=0.05, seed=0, download_missing=False, mirror=None):
    """{split: (uint8 sequences (B, D), labels (B,))} for splits among 'train', 'val', 'test',
    reading the training files (and the test files) once however many splits come from them.

    'val' is a seeded random `val_fraction` of the training files; 'train' is the rest.
    download_missing fetches the official files that are missing (see `download`)."""
    info = dataset_info(name)
    if name in CACHED:
        raise UserError(f"{name} is read through its cache: use load_from_config (imagegen/source.py).")
    for split in splits:
        if split not in ("train", "val", "test"):
            raise UserError(f"unknown split {split!r}; choose train, val or test.")
    if not 0 <= val_fraction < 1:
        raise UserError(f"data.val_fraction must be at least 0 and below 1, not {val_fraction}.")
    if download_missing:
        download(name, root, mirror, splits)
    loader = load_mnist if name == "mnist" else load_cifar10
    out = {}
    for train_files in sorted({split != "test" for split in splits}):
        x, y = loader(root, train=train_files)
        assert x.shape[1] == info.length
        files = "training" if train_files else "test"
        if len(x) == 0:
            raise UserError(f"the {files} files of {name} in {root} hold no images; replace them with the "
                            f"official files.")
        if not train_files:
            out["test"] = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y)
            continue
        perm = np.random.default_rng(seed).permutation(len(x))
        n_val = max(1, int(round(len(x) * val_fraction)))
        for split in {"train", "val"} & set(splits):
            idx = perm[:n_val] if split == "val" else perm[n_val:]
            if len(idx) == 0:
                raise UserError(f"the {split} split of {name} in {root} is empty: {len(x)} training images with "
                                f"data.val_fraction={val_fraction} leave none for it; lower data.val_fraction "
                                f"or add training images.")
            out[split] = torch.from_numpy(np.ascontiguousarray(x[idx])), torch.from_numpy(y[idx])
    return out


def load_split(name, root, split, val_fraction=0.05, seed=0, download_missing=False, mirror=None):
    """Uint8 sequences (B, D) and labels (B,) of one split (see `load_splits`)."""
    return load_splits(name, root, (split,), val_fraction, seed, download_missing, mirror)[split]


def load_from_config(data_cfg, splits, overrides=None, labels=False):
    """[sequences (B, D) of each split in splits] as described by a `data` config section
    (dict); non-null `overrides` (e.g. a new root) replace its values. labels=True: [(sequences,
    labels (B,) long)] instead. A folder's sequences are source.ImageRows over its memory-mapped
    cache (indexing one gives a uint8 tensor), the standard sets' uint8 tensors."""
    d = {**data_cfg, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    if d["name"] in CACHED:
        from .source import load
        return load(d, splits, labels)
    loaded = load_splits(d["name"], d["root"], splits, d["val_fraction"], d["split_seed"], d["download"],
                         d.get("mirror"))
    return [loaded[split] if labels else loaded[split][0] for split in splits]
