"""The standard sets' official files: what they are (folder, URL, md5 of each file, the CIFAR
batches' names and keys) and where they lie under data.root (which are there, which are missing,
the sentences naming them).

MNIST, Fashion-MNIST: IDX files in torchvision's layout, `<root>/MNIST/raw/` and
`<root>/FashionMNIST/raw/`, each `{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`.
CIFAR-10, CIFAR-100: the python pickles in `<root>/cifar-10-batches-py/` (any of data_batch_1..5,
test_batch) and `<root>/cifar-100-python/` (train, test; fine labels).
"""
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError


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


def open_file(path):
    """The file at path opened for reading, or one UserError sentence saying why it cannot be."""
    try:
        return open(path, "rb")
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror or e}); make it a readable file (check its permissions) "
                        f"or point data.root elsewhere.") from None


def check_root(root):
    """Refuse a data.root that is a file."""
    if os.path.exists(root) and not os.path.isdir(root):
        raise UserError(f"data.root {root} is a file, not a folder; point data.root at the folder holding the data.")


def find(raw_dir, stem):
    """raw_dir/stem.gz, else raw_dir/stem, else None."""
    for name in (stem + ".gz", stem):
        if os.path.exists(raw_dir / name):
            return raw_dir / name
    return None


def missing_files(name, root, train):
    """The official files that name's training (train=True) or test files come from and that root lacks: an
    IDX set's absent .gz files (a file counts gzipped or not), a CIFAR set's archive when none of the split's
    batches is there."""
    spec = OFFICIAL[name]
    folder = Path(root) / spec.folder
    if not spec.idx:
        return [] if batches(spec, folder, train) else list(spec.md5)
    prefix = "train" if train else "t10k"
    return [f"{prefix}-{kind}-ubyte.gz" for kind in ("images-idx3", "labels-idx1")
            if find(folder, f"{prefix}-{kind}-ubyte") is None]


def not_found(name, root, what, files):
    """The sentence for a set whose files are not under root: what (which are not, where), files (to fetch)."""
    spec = OFFICIAL[name]
    urls = " ".join(spec.url + f for f in files)
    by_hand = f"into {Path(root) / spec.folder} by hand" if spec.idx else f"by hand and unpack it in {root}"
    near = near_miss(name, root)
    if near is not None:
        return UserError(f"{spec.title} not found: {what}; did you mean data.root={near} (which holds them)?")
    return UserError(f"{spec.title} not found: {what}{holds_other(name, root)}; pass data.download=true to fetch "
                     f"them, or download {urls} {by_hand}, or point data.root at the folder holding {spec.folder}.")


def near_miss(name, root, most=100):
    """The folder data.root was likely meant to name, when name's files are not under root: one that holds
    them (either split) among root's parents as deep as the set's folder (MNIST/raw: the parent and
    grandparent, so root=X/MNIST/raw finds X) and root's subfolders (the first `most`; root=data finds
    data/mnist), else None."""
    root = Path(root).expanduser()
    up = list(root.parents)[:len(Path(OFFICIAL[name].folder).parts)]
    try:
        down = sorted(p for p in root.iterdir() if p.is_dir())[:most] if root.is_dir() else []
    except OSError:
        down = []
    return next((p for p in up + down if not all(missing_files(name, p, t) for t in (True, False))), None)


def batches(spec, folder, train):
    """The paths of a CIFAR set's training (train=True) or test batches that folder holds."""
    names = spec.train if train else (spec.test,)
    return [folder / n for n in names if os.path.exists(folder / n)]


def holds_other(name, root):
    """" (which holds MNIST files, not CIFAR-10)" when root holds another standard set's files but none of
    `name`'s (a data.root pointing at the wrong dataset), else ""."""
    held = [n for n in OFFICIAL if not all(missing_files(n, root, t) for t in (True, False))]
    if not held or name in held:
        return ""
    return f" (which holds {OFFICIAL[held[0]].title} files, not {OFFICIAL[name].title})"
