"""A standard set's splits: train and val from its training files (a seeded share for val), test from its
test files, each uint8 sequences (B, D) in raster order with channels interleaved per pixel (MNIST
D = 784, CIFAR D = 3072) and int64 labels (B,).
"""
import os

import numpy as np
import torch

from . import catalogue
from .cifar import load_cifar
from .download import download
from .idx import load_idx
from .official import OFFICIAL, check_root
from ..errors import UserError


def load_splits(name, root, splits, val_fraction=0.05, seed=0, download_missing=False, mirror=None):
    """{split: (uint8 sequences (B, D), labels (B,))} for splits among 'train', 'val', 'test',
    reading the training files (and the test files) once however many splits come from them.

    'val' is a seeded random `val_fraction` of the training files; 'train' is the rest.
    download_missing fetches the official files that are missing (see `download`)."""
    info = catalogue.info(name)
    root = root if root is None else os.path.expanduser(root)     # "~/d": the home folder's d, never ./~
    if name in catalogue.CACHED:
        raise UserError(f"{name} is read through its cache: use load_from_config (imagegen/data/sets.py).")
    for split in splits:
        if split not in ("train", "val", "test"):
            raise UserError(f"unknown split {split!r}; choose train, val or test.")
    if not 0 <= val_fraction < 1:
        raise UserError(f"data.val_fraction must be at least 0 and below 1, not {val_fraction}.")
    check_root(root)
    if download_missing:
        download(name, root, mirror, splits)
    loader = load_idx if OFFICIAL[name].idx else load_cifar
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
