"""MNIST and Fashion-MNIST: the IDX reader (gzipped or not) and a set's images and labels from its files.

Reading never holds more than the file's header promises; every bad file is one UserError sentence.
"""
import gzip
import os
import zlib
from pathlib import Path

import numpy as np
import torch

from .catalogue import DATASETS
from .official import OFFICIAL, find, missing_files, not_found, open_file
from ..errors import UserError
from ..tuning.machine import available_bytes

_CHUNK = 1 << 20


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
    with open_file(path) as f:
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


def load_idx(name, root, train):
    """(uint8 sequences (N, D), int64 labels (N,)) of an IDX set's training or test files."""
    spec, info = OFFICIAL[name], DATASETS[name]
    folder = Path(root) / spec.folder
    absent = missing_files(name, root, train)
    if absent:
        raise not_found(name, root, f"{', '.join(absent)} missing from {folder} (gzipped or not)", absent)
    prefix = "train" if train else "t10k"
    images_path = find(folder, f"{prefix}-images-idx3-ubyte")
    labels_path = find(folder, f"{prefix}-labels-idx1-ubyte")
    images = read_idx(images_path, 3, (info.height, info.width), spec.title)
    labels = read_idx(labels_path, 1, title=spec.title)
    if len(labels) != len(images):
        raise UserError(f"{labels_path} holds {len(labels)} labels but {images_path} holds {len(images)} images; "
                        f"the two files do not belong together.")
    return images.reshape(len(images), info.length).copy(), labels.astype(np.int64)
