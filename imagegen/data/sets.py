"""The standard sets' readers of the official files, first-run download, image <-> sequence.

MNIST, Fashion-MNIST: IDX files in torchvision's layout, `<root>/MNIST/raw/` and
`<root>/FashionMNIST/raw/`, each `{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`.
CIFAR-10, CIFAR-100: the python pickles in `<root>/cifar-10-batches-py/` (any of data_batch_1..5,
test_batch) and `<root>/cifar-100-python/` (train, test; fine labels). OFFICIAL describes each.
Images become uint8 sequences of D sub-pixels in raster order, channels interleaved per
pixel (CIFAR: r, g, b, r, g, b, ...): MNIST D = 784, CIFAR D = 3072.

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

from ..errors import UserError
from ..memory import available_bytes

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


FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# CIFAR-100's fine labels, in the order of the official meta file's fine_label_names
CIFAR100_CLASSES = ("apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle",
                    "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle",
                    "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch", "crab", "crocodile", "cup",
                    "dinosaur", "dolphin", "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house",
                    "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man",
                    "maple_tree", "motorcycle", "mountain", "mouse", "mushroom", "oak_tree", "orange", "orchid",
                    "otter", "palm_tree", "pear", "pickup_truck", "pine_tree", "plain", "plate", "poppy", "porcupine",
                    "possum", "rabbit", "raccoon", "ray", "road", "rocket", "rose", "sea", "seal", "shark", "shrew",
                    "skunk", "skyscraper", "snail", "snake", "spider", "squirrel", "streetcar", "sunflower",
                    "sweet_pepper", "table", "tank", "telephone", "television", "tiger", "tractor", "train", "trout",
                    "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm")
IMAGENET_CLASSES = tuple(str(k) for k in range(1, 1001))      # the downsampled files' 1-based label numbers
DATASETS = {"mnist": DatasetInfo("mnist", 28, 28, 1, tuple(str(d) for d in range(10))),
            "fashion_mnist": DatasetInfo("fashion_mnist", 28, 28, 1, FASHION_CLASSES),
            "cifar10": DatasetInfo("cifar10", 32, 32, 3, CIFAR10_CLASSES),
            "cifar100": DatasetInfo("cifar100", 32, 32, 3, CIFAR100_CLASSES),
            "imagenet32": DatasetInfo("imagenet32", 32, 32, 3, IMAGENET_CLASSES),   # imagegen/data/imagenet.py
            "imagenet64": DatasetInfo("imagenet64", 64, 64, 3, IMAGENET_CLASSES)}
CACHED = ("folder", "imagenet32", "imagenet64")     # read from a memory-mapped cache (imagegen/data/source.py)


@dataclass(frozen=True)
class Official:
    """A standard set's official files: title (as sentences name it), folder (under data.root), url (the
    official base URL) and md5 (each file fetched from it -> its md5: an IDX set's four .gz files, a CIFAR
    set's archive). CIFAR sets only: train (the training batches, any subset of which is read), test (the
    test batch), keep (the archive's members unpacked), labels (the batches' key of the labels), meta and
    meta_key (the file and its key naming the classes, checked against DATASETS when the file is there)."""
    title: str
    folder: str
    url: str
    md5: dict
    train: tuple = ()          # empty: an IDX set, whose files have MNIST's names
    test: str = ""
    keep: tuple = ()
    labels: str = "labels"
    meta: str = ""
    meta_key: str = ""

    @property
    def idx(self):
        return not self.train


CIFAR_URL = "https://www.cs.toronto.edu/~kriz/"
CIFAR10_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
OFFICIAL = {  # the md5s as torchvision's MNIST, FashionMNIST, CIFAR10 and CIFAR100 check them
    "mnist": Official("MNIST", "MNIST/raw", "https://ossci-datasets.s3.amazonaws.com/mnist/", md5={
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c"}),
    "fashion_mnist": Official("Fashion-MNIST", "FashionMNIST/raw",
                              "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/", md5={
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310"}),
    "cifar10": Official("CIFAR-10", "cifar-10-batches-py", CIFAR_URL,
                        md5={"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a"},
                        train=CIFAR10_BATCHES, test="test_batch",
                        keep=CIFAR10_BATCHES + ("test_batch", "batches.meta", "readme.html"),
                        meta="batches.meta", meta_key="label_names"),
    "cifar100": Official("CIFAR-100", "cifar-100-python", CIFAR_URL,
                         md5={"cifar-100-python.tar.gz": "eb9058c3a382ffc7106e4002c42a8d85"},
                         train=("train",), test="test", keep=("train", "test", "meta"), labels="fine_labels",
                         meta="meta", meta_key="fine_label_names"),
}
MIRROR_ENV = "IMAGEGEN_DATA_MIRROR"  # base URL holding the official files, used when data.mirror is null
MAX_DOWNLOAD = 256 << 20             # bytes; every official file is smaller
MAX_MEMBER = 256 << 20               # bytes; every file in the official CIFAR archives is smaller (the largest,
                                     # CIFAR-100's train, holds 153.6 MB of pixels)
_CHUNK = 1 << 20


def dataset_info(name):
    """DatasetInfo of a dataset name (mnist, cifar10, ...) or of a data config section (a dict): a folder's
    size and channels come from its config, its class names from the config or the folder's cache."""
    if isinstance(name, dict):
        if name.get("name") == "folder":
            from .source import folder_info
            return folder_info(name)
        name = name.get("name")
    if name not in DATASETS:
        raise UserError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS) + ['folder']} (data=mnist, "
                        f"data=cifar100, data=imagenet32, or data=folder data.root=DIR for a folder of images).")
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


def read_idx(path, expected_dims, item_shape=None, title="MNIST"):
    """Parse an IDX file (gzipped or not): big-endian header, magic 0x0000_08_<ndim>, uint8 data.

    The header's shape bounds what is read (a gzip stream that inflates further is refused, not
    inflated); item_shape (e.g. (28, 28)) is checked against the header before the data is read.
    title names the set in the error sentences."""
    with _open(path) as f:
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        stream = gzip.GzipFile(fileobj=f, mode="rb") if gz else f
        try:
            return _parse_idx(path, stream, expected_dims, item_shape, None if gz else os.fstat(f.fileno()).st_size,
                              title)
        except (OSError, EOFError, zlib.error) as e:
            if not gz:
                raise UserError(f"cannot read {path} ({e}); check the file and its disk.") from None
            raise UserError(f"{path} is a corrupt gzip file ({e}); delete it and download it again.") from None


def _parse_idx(path, stream, expected_dims, item_shape, file_size, title):
    magic = _read_upto(stream, 4)
    if len(magic) < 4 or magic[0:3] != b"\x00\x00\x08" or magic[3] != expected_dims:
        raise UserError(f"{path} is not an IDX uint8 file with {expected_dims} dimensions (bad magic number); "
                        f"replace it with the official {title} file.")
    header = 4 + 4 * expected_dims
    dims = _read_upto(stream, header - 4)
    if len(dims) < header - 4:
        raise UserError(f"{path} is truncated inside its IDX header; download it again.")
    shape = tuple(int.from_bytes(dims[4 * i: 4 * i + 4], "big") for i in range(expected_dims))
    if item_shape is not None and shape[1:] != tuple(item_shape):
        raise UserError(f"{path} holds items of shape {shape[1:]}, not {tuple(item_shape)}; it is not {title}.")
    size = int(np.prod(shape, dtype=object))
    if file_size is not None and file_size != header + size:
        raise UserError(f"{path} is truncated or padded: its header promises shape {shape} "
                        f"({header + size} bytes) but it holds {file_size} bytes; download it again.")
    if size > available_bytes(torch.device("cpu")):
        raise UserError(f"{path} promises shape {shape} ({size} bytes), more than the memory available; "
                        f"it is not a {title} file, download it again.")
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


def _missing(name, root, train):
    """The official files that name's training (train=True) or test files come from and that root lacks: an
    IDX set's absent .gz files (a file counts gzipped or not), a CIFAR set's archive when none of the split's
    batches is there."""
    spec = OFFICIAL[name]
    folder = Path(root) / spec.folder
    if not spec.idx:
        return [] if _batches(spec, folder, train) else list(spec.md5)
    prefix = "train" if train else "t10k"
    return [f"{prefix}-{kind}-ubyte.gz" for kind in ("images-idx3", "labels-idx1")
            if _find(folder, f"{prefix}-{kind}-ubyte") is None]


def _not_found(name, root, what, files):
    """The sentence for a set whose files are not under root: what (which are not, where), files (to fetch)."""
    spec = OFFICIAL[name]
    urls = " ".join(spec.url + f for f in files)
    by_hand = f"into {Path(root) / spec.folder} by hand" if spec.idx else f"by hand and unpack it in {root}"
    return UserError(f"{spec.title} not found: {what}{holds_other(name, root)}; pass data.download=true to fetch "
                     f"them, or download {urls} {by_hand}, or point data.root at the folder holding {spec.folder}.")


def _load_idx(name, root, train):
    """(uint8 sequences (N, D), int64 labels (N,)) of an IDX set's training or test files."""
    spec, info = OFFICIAL[name], DATASETS[name]
    folder = Path(root) / spec.folder
    missing = _missing(name, root, train)
    if missing:
        raise _not_found(name, root, f"{', '.join(missing)} missing from {folder} (gzipped or not)", missing)
    prefix = "train" if train else "t10k"
    images_path = _find(folder, f"{prefix}-images-idx3-ubyte")
    labels_path = _find(folder, f"{prefix}-labels-idx1-ubyte")
    images = read_idx(images_path, 3, (info.height, info.width), spec.title)
    labels = read_idx(labels_path, 1, title=spec.title)
    if len(labels) != len(images):
        raise UserError(f"{labels_path} holds {len(labels)} labels but {images_path} holds {len(images)} images; "
                        f"the two files do not belong together.")
    return images.reshape(len(images), info.length).copy(), labels.astype(np.int64)


# ---------------------------------------------------------------- CIFAR-10, CIFAR-100 (python pickles)
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


_ALLOWED = {  # every global the official CIFAR python files (and numpy 1 or 2 re-pickles) name
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

    def __init__(self, file, path, title):
        super().__init__(file, encoding="latin1")
        self.path, self.title = path, title

    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return _ALLOWED[module, name]
        raise UserError(f"{self.path} asks to load {module}.{name}, which no {self.title} file holds; it was refused "
                        f"without running anything (the file may be hostile): delete it and download it again.")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent ids")


def _unpickle(path, title="CIFAR-10"):
    """What a CIFAR python file holds, through the restricted unpickler; title names the set in the errors."""
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > available_bytes(torch.device("cpu")) // 2:
            raise UserError(f"{path} holds {size} bytes, more than any {title} file and than the memory "
                            f"available to read it; it is not {title}.")
        try:
            raw = f.read()
        except OSError as e:
            raise UserError(f"cannot read {path} ({e}); check the file and its disk.") from None
    try:
        for _ in pickletools.genops(io.BytesIO(raw)):  # every length field within the file, before allocating
            pass
        return _CifarUnpickler(io.BytesIO(raw), path, title).load()
    except UserError:
        raise
    except Exception as e:  # pickle raises many types on bad input
        why = f"{type(e).__name__}: {e}" if isinstance(e, pickle.UnpicklingError) else type(e).__name__
        raise UserError(f"{path} is not a readable {title} python file ({' '.join(why.split())[:160]}); "
                        f"download it again.") from None


def _is_label(v, n):
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v < n


def read_cifar_batch(path, name="cifar10"):
    """(uint8 sequences (B, 3072) in raster order, int64 labels (B,)) of one python batch of a CIFAR set."""
    spec, n = OFFICIAL[name], DATASETS[name].num_classes
    batch = _unpickle(path, spec.title)
    if not isinstance(batch, dict) or "data" not in batch or spec.labels not in batch:
        raise UserError(f"{path} is not a {spec.title} batch (no 'data'/{spec.labels!r} keys); download it again.")
    data, labels = batch["data"], batch[spec.labels]
    data = data.view(np.ndarray) if isinstance(data, np.ndarray) else data
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        desc = f"data of shape {data.shape} and dtype {data.dtype}" if isinstance(data, np.ndarray) else \
            f"data of type {type(data).__name__}"
        raise UserError(f"{path} holds {desc}, not N x 3072 uint8; it is not {spec.title}.")
    if not isinstance(labels, list) or not all(_is_label(v, n) for v in labels):
        raise UserError(f"{path} holds {spec.labels} that are not a list of integers 0..{n - 1}; it is not "
                        f"{spec.title}, download it again.")
    if len(labels) != len(data):
        raise UserError(f"{path} holds {len(data)} images but {len(labels)} labels; download it again.")
    # channel-planar R(1024) G(1024) B(1024) -> raster order with r, g, b interleaved per pixel
    seq = data.reshape(-1, 3, 1024).transpose(0, 2, 1).reshape(-1, 3072)
    return np.ascontiguousarray(seq), np.array(labels, dtype=np.int64).reshape(len(labels))


def _batches(spec, folder, train):
    names = spec.train if train else (spec.test,)
    return [folder / n for n in names if os.path.exists(folder / n)]


def _check_class_names(name, path):
    """Refuse a CIFAR set's meta file that does not name DATASETS[name]'s classes, in their order."""
    spec, names = OFFICIAL[name], DATASETS[name].class_names
    meta = _unpickle(path, spec.title)
    if not isinstance(meta, dict) or meta.get(spec.meta_key) != list(names):
        raise UserError(f"{path} does not name {spec.title}'s {len(names)} classes ({names[0]}, {names[1]}, ..., "
                        f"{names[-1]}) in {spec.meta_key!r}; it is not {spec.title}'s {spec.meta} file, download it "
                        f"again.")


def _load_cifar(name, root, train):
    """(uint8 sequences (N, 3072), int64 labels (N,)) of a CIFAR set's training or test batches."""
    spec = OFFICIAL[name]
    folder = Path(root) / spec.folder
    paths = _batches(spec, folder, train)
    if not paths:
        what = f"no {'training' if train else 'test'} batch ({', '.join(spec.train if train else (spec.test,))})"
        raise _not_found(name, root, f"{what} in {folder}", list(spec.md5))
    if os.path.exists(folder / spec.meta):
        _check_class_names(name, folder / spec.meta)
    parts = [read_cifar_batch(p, name) for p in paths]
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


def holds_other(name, root):
    """" (which holds MNIST files, not CIFAR-10)" when root holds another standard set's files but none of
    `name`'s (a data.root pointing at the wrong dataset), else ""."""
    held = [n for n in OFFICIAL if not all(_missing(n, root, t) for t in (True, False))]
    if not held or name in held:
        return ""
    return f" (which holds {OFFICIAL[held[0]].title} files, not {OFFICIAL[name].title})"


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
    spec = OFFICIAL[name]
    base = _base_url(spec.url, mirror)
    missing = list(dict.fromkeys(f for t in train_files for f in _missing(name, root, t)))
    for i, fname in enumerate(missing):
        dest = root / spec.folder / fname if spec.idx else root / fname    # a CIFAR set's archive: unpacked below
        if not (os.path.exists(dest) and _md5(dest) == spec.md5[fname]):   # (an archive an earlier run left)
            _fetch(base + fname, dest, spec.md5[fname], spec.title, where, [base + f for f in missing[i:]],
                   unpack=not spec.idx)
        if not spec.idx:
            _extract(spec, dest, root)
            os.unlink(dest)


# ---------------------------------------------------------------- splits
def load_splits(name, root, splits, val_fraction=0.05, seed=0, download_missing=False, mirror=None):
    """{split: (uint8 sequences (B, D), labels (B,))} for splits among 'train', 'val', 'test',
    reading the training files (and the test files) once however many splits come from them.

    'val' is a seeded random `val_fraction` of the training files; 'train' is the rest.
    download_missing fetches the official files that are missing (see `download`)."""
    info = dataset_info(name)
    if name in CACHED:
        raise UserError(f"{name} is read through its cache: use load_from_config (imagegen/data/source.py).")
    for split in splits:
        if split not in ("train", "val", "test"):
            raise UserError(f"unknown split {split!r}; choose train, val or test.")
    if not 0 <= val_fraction < 1:
        raise UserError(f"data.val_fraction must be at least 0 and below 1, not {val_fraction}.")
    _check_root(root)
    if download_missing:
        download(name, root, mirror, splits)
    loader = _load_idx if OFFICIAL[name].idx else _load_cifar
    out = {}
    for train_files in sorted({split != "test" for split in splits}):
        x, y = loader(name, root, train_files)
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
