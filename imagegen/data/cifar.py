"""CIFAR-10 and CIFAR-100: the python pickles read through a restricted unpickler (reading a file never
runs code), a batch as uint8 sequences in raster order (r, g, b per pixel), a set's batches.
"""
import io
import os
import pickle
import pickletools
from pathlib import Path

import numpy as np
import torch

from .catalogue import DATASETS
from .official import OFFICIAL, batches, not_found, open_file
from ..errors import UserError
from ..tuning.machine import available_bytes


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
    with open_file(path) as f:
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
    if not len(data):
        raise UserError(f"{path} holds no images (a batch of 0); it is not {spec.title}, download it again.")
    if len(labels) != len(data):
        raise UserError(f"{path} holds {len(data)} images but {len(labels)} labels; download it again.")
    # channel-planar R(1024) G(1024) B(1024) -> raster order with r, g, b interleaved per pixel
    seq = data.reshape(-1, 3, 1024).transpose(0, 2, 1).reshape(-1, 3072)
    return np.ascontiguousarray(seq), np.array(labels, dtype=np.int64).reshape(len(labels))


def _check_class_names(name, path):
    """Refuse a CIFAR set's meta file that does not name DATASETS[name]'s classes, in their order."""
    spec, names = OFFICIAL[name], DATASETS[name].class_names
    meta = _unpickle(path, spec.title)
    if not isinstance(meta, dict) or meta.get(spec.meta_key) != list(names):
        raise UserError(f"{path} does not name {spec.title}'s {len(names)} classes ({names[0]}, {names[1]}, ..., "
                        f"{names[-1]}) in {spec.meta_key!r}; it is not {spec.title}'s {spec.meta} file, download it "
                        f"again.")


def load_cifar(name, root, train):
    """(uint8 sequences (N, 3072), int64 labels (N,)) of a CIFAR set's training or test batches."""
    spec = OFFICIAL[name]
    folder = Path(root) / spec.folder
    paths = batches(spec, folder, train)
    if not paths:
        what = f"no {'training' if train else 'test'} batch ({', '.join(spec.train if train else (spec.test,))})"
        raise not_found(name, root, f"{what} in {folder}", list(spec.md5))
    if os.path.exists(folder / spec.meta):
        _check_class_names(name, folder / spec.meta)
    parts = [read_cifar_batch(p, name) for p in paths]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
