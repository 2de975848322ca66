"""MNIST and CIFAR-10 readers of the standard files, optional download, image <-> sequence.

MNIST: torchvision's layout `<root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`.
CIFAR-10: the python batches in `<root>/cifar-10-batches-py/` (any of data_batch_1..5, test_batch).
Images become uint8 sequences of D sub-pixels in raster order, channels interleaved per
pixel (CIFAR: r, g, b, r, g, b, ...): MNIST D = 784, CIFAR-10 D = 3072.
"""
import gzip
import hashlib
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import UserError


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    height: int
    width: int
    channels: int

    @property
    def length(self):  # D, the number of sub-pixels per image
        return self.height * self.width * self.channels


DATASETS = {"mnist": DatasetInfo("mnist", 28, 28, 1), "cifar10": DatasetInfo("cifar10", 32, 32, 3)}

MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
MNIST_FILES = {  # file -> md5 of the official gzipped file
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR_MD5 = "c58f30108f718f92721af3b95e74349a"


def dataset_info(name):
    if name not in DATASETS:
        raise UserError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)} (data=mnist or data=cifar10).")
    return DATASETS[name]


# ---------------------------------------------------------------- MNIST (IDX files)
def _read_maybe_gz(path):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise UserError(f"{path} is a corrupt gzip file ({e}); delete it and download it again.") from None
    return raw


def read_idx(path, expected_dims):
    """Parse an IDX file (gzipped or not): big-endian header, magic 0x0000_08_<ndim>, uint8 data."""
    raw = _read_maybe_gz(path)
    if len(raw) < 4 or raw[0:3] != b"\x00\x00\x08" or raw[3] != expected_dims:
        raise UserError(f"{path} is not an IDX uint8 file with {expected_dims} dimensions (bad magic number); "
                        f"replace it with the official MNIST file.")
    header = 4 + 4 * expected_dims
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(expected_dims))
    if len(raw) != header + int(np.prod(shape)):
        raise UserError(f"{path} is truncated or padded: its header promises shape {shape} "
                        f"({header + int(np.prod(shape))} bytes) but it holds {len(raw)} bytes; download it again.")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _find(raw_dir, stem):
    for name in (stem + ".gz", stem):
        if (raw_dir / name).exists():
            return raw_dir / name
    return None


def load_mnist(root, train):
    raw_dir = Path(root) / "MNIST" / "raw"
    prefix = "train" if train else "t10k"
    images_path = _find(raw_dir, f"{prefix}-images-idx3-ubyte")
    labels_path = _find(raw_dir, f"{prefix}-labels-idx1-ubyte")
    if images_path is None or labels_path is None:
        raise UserError(f"MNIST not found: expected {raw_dir}/{prefix}-images-idx3-ubyte[.gz] and "
                        f"{prefix}-labels-idx1-ubyte[.gz]; point data.root at the folder holding MNIST/raw "
                        f"or pass data.download=true.")
    images = read_idx(images_path, 3)
    labels = read_idx(labels_path, 1)
    if images.shape[1:] != (28, 28):
        raise UserError(f"{images_path} holds images of shape {images.shape[1:]}, not 28x28; it is not MNIST.")
    if len(labels) != len(images):
        raise UserError(f"{labels_path} holds {len(labels)} labels but {images_path} holds {len(images)} images; "
                        f"the two files do not belong together.")
    return images.reshape(len(images), 784).copy(), labels.astype(np.int64)


# ---------------------------------------------------------------- CIFAR-10 (python batches)
def read_cifar_batch(path):
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="latin1")
    except Exception as e:  # pickle raises many types on bad input
        raise UserError(f"{path} is not a readable CIFAR-10 python batch ({type(e).__name__}); "
                        f"download it again.") from None
    if not isinstance(batch, dict) or "data" not in batch or "labels" not in batch:
        raise UserError(f"{path} is not a CIFAR-10 batch (no 'data'/'labels' keys); download it again.")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch["labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise UserError(f"{path} holds data of shape {data.shape} and dtype {data.dtype}, "
                        f"not N x 3072 uint8; it is not CIFAR-10.")
    if len(labels) != len(data):
        raise UserError(f"{path} holds {len(data)} images but {len(labels)} labels; download it again.")
    # channel-planar R(1024) G(1024) B(1024) -> raster order with r, g, b interleaved per pixel
    seq = data.reshape(-1, 3, 1024).transpose(0, 2, 1).reshape(-1, 3072)
    return np.ascontiguousarray(seq), labels


def load_cifar10(root, train):
    folder = Path(root) / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
    paths = [folder / n for n in names if (folder / n).exists()]
    if not paths:
        raise UserError(f"CIFAR-10 not found: expected {folder}/{'data_batch_1..5' if train else 'test_batch'}; "
                        f"point data.root at the folder holding cifar-10-batches-py or pass data.download=true.")
    parts = [read_cifar_batch(p) for p in paths]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


# ---------------------------------------------------------------- download
def _md5(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fetch(url, dest, md5):
    import urllib.request
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and _md5(dest) == md5:
        return
    tmp = dest.with_suffix(dest.suffix + ".part")
    try:
        urllib.request.urlretrieve(url, tmp)
    except OSError as e:
        raise UserError(f"could not download {url} ({e}); fetch it by hand into {dest.parent}.") from None
    if _md5(tmp) != md5:
        tmp.unlink()
        raise UserError(f"{url} downloaded with a wrong checksum; try again or fetch it by hand into {dest.parent}.")
    tmp.replace(dest)


def download(name, root):
    """Fetch the official files into root (torchvision when importable, else urllib), verifying checksums."""
    root = Path(root)
    try:
        import torchvision.datasets as tvd
        (tvd.MNIST if name == "mnist" else tvd.CIFAR10)(str(root), download=True)
        return
    except ImportError:
        pass
    except Exception as e:
        raise UserError(f"torchvision could not download {name} into {root} ({e}); fetch the files by hand.") from None
    if name == "mnist":
        for fname, md5 in MNIST_FILES.items():
            _fetch(MNIST_URL + fname, root / "MNIST" / "raw" / fname, md5)
    else:
        import tarfile
        archive = root / "cifar-10-python.tar.gz"
        _fetch(CIFAR_URL, archive, CIFAR_MD5)
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")


# ---------------------------------------------------------------- splits
def load_splits(name, root, splits, val_fraction=0.05, seed=0, download_missing=False):
    """{split: (uint8 sequences (B, D), labels (B,))} for splits among 'train', 'val', 'test',
    reading the training files (and the test files) once however many splits come from them.

    'val' is a seeded random `val_fraction` of the training files; 'train' is the rest."""
    info = dataset_info(name)
    for split in splits:
        if split not in ("train", "val", "test"):
            raise UserError(f"unknown split {split!r}; choose train, val or test.")
    if download_missing:
        download(name, root)
    loader = load_mnist if name == "mnist" else load_cifar10
    out = {}
    for train_files in sorted({split != "test" for split in splits}):
        x, y = loader(root, train=train_files)
        assert x.shape[1] == info.length
        if not train_files:
            out["test"] = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y)
            continue
        perm = np.random.default_rng(seed).permutation(len(x))
        n_val = max(1, int(round(len(x) * val_fraction)))
        for split in {"train", "val"} & set(splits):
            idx = perm[:n_val] if split == "val" else perm[n_val:]
            out[split] = torch.from_numpy(np.ascontiguousarray(x[idx])), torch.from_numpy(y[idx])
    return out


def load_split(name, root, split, val_fraction=0.05, seed=0, download_missing=False):
    """Uint8 sequences (B, D) and labels (B,) of one split (see `load_splits`)."""
    return load_splits(name, root, (split,), val_fraction, seed, download_missing)[split]


def sequence_to_image(seq, info):
    """(B, D) uint8 -> (B, H, W, C) uint8."""
    return seq.reshape(-1, info.height, info.width, info.channels)


def image_to_sequence(img):
    """(B, H, W, C) uint8 -> (B, D) uint8."""
    return img.reshape(img.shape[0], -1)


def load_from_config(data_cfg, splits, overrides=None):
    """[sequences (B, D) of each split in splits] as described by a `data` config section
    (dict); non-null `overrides` (e.g. a new root) replace its values."""
    d = {**data_cfg, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    loaded = load_splits(d["name"], d["root"], splits, d["val_fraction"], d["split_seed"], d["download"])
    return [loaded[split][0] for split in splits]
