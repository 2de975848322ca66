"""Property-based fuzzing of the MNIST and CIFAR-10 readers: any bytes load as valid data or
raise the project's one-sentence UserError, never another exception (and never run code).
Each run draws fresh examples; in CI (CI set: tests/conftest.py's "ci" profile) a fixed sequence."""
import gzip
import os
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures import idx_bytes, py2_cifar_pickle
from imagegen.data.cifar import read_cifar_batch
from imagegen.data.idx import read_idx
from imagegen.errors import UserError

FUZZ = settings(max_examples=200, deadline=None, database=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture])

IMAGES = idx_bytes(np.random.default_rng(0).integers(0, 256, size=(3, 28, 28)).astype(np.uint8))
LABELS = idx_bytes(np.array([3, 1, 4, 1, 5], np.uint8))
CIFAR_DATA = np.random.default_rng(1).integers(0, 256, size=(2, 3072), dtype=np.uint8)
CIFAR = {
    "protocol 4": pickle.dumps({"data": CIFAR_DATA, "labels": [1, 2], "filenames": ["a.png", "b.png"]}, protocol=4),
    "protocol 5": pickle.dumps({"data": CIFAR_DATA, "labels": [1, 2]}, protocol=5),
    "python 2": py2_cifar_pickle(CIFAR_DATA, [1, 2]),
}


def mutations(seed_bytes):
    """Valid bytes changed by bit flips, overwritten bytes, a cut, or inserted bytes."""
    n = len(seed_bytes)
    flips = st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 7)), min_size=1, max_size=8)
    writes = st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 255)), min_size=1, max_size=8)

    def flip(changes):
        b = bytearray(seed_bytes)
        for pos, bit in changes:
            b[pos] ^= 1 << bit
        return bytes(b)

    def write(changes):
        b = bytearray(seed_bytes)
        for pos, value in changes:
            b[pos] = value
        return bytes(b)
    return st.one_of(
        flips.map(flip),
        writes.map(write),
        st.integers(0, n - 1).map(lambda k: seed_bytes[:k]),
        st.tuples(st.integers(0, n), st.binary(min_size=1, max_size=16)).map(
            lambda a: seed_bytes[:a[0]] + a[1] + seed_bytes[a[0]:]),
    )


def check_idx(path, content, dims):
    path.write_bytes(content)
    try:
        out = read_idx(path, dims)
    except UserError as e:
        assert str(e).isprintable(), str(e)          # one line, no terminal controls
        return
    assert out.dtype == np.uint8 and out.ndim == dims


def check_cifar(path, content):
    path.write_bytes(content)
    try:
        x, y = read_cifar_batch(path)
    except UserError as e:
        assert str(e).isprintable(), str(e)          # one line, no terminal controls
        return
    assert x.dtype == np.uint8 and x.shape == (len(y), 3072) and y.dtype == np.int64
    assert all(0 <= v < 10 for v in y.tolist())


@FUZZ
@given(content=st.binary(max_size=4096), dims=st.sampled_from([1, 3]),
       wrap=st.sampled_from(["raw", "gzip", "gzip magic"]))
@pytest.mark.slow
def test_any_bytes_as_an_idx_file(tmp_path, content, dims, wrap):
    if wrap == "gzip":
        content = gzip.compress(content)
    elif wrap == "gzip magic":
        content = b"\x1f\x8b" + content
    check_idx(tmp_path / "file", content, dims)


@pytest.mark.slow
@FUZZ
@given(data=st.data(), which=st.sampled_from(["images", "labels"]), gz=st.booleans())
def test_mutated_idx_files(tmp_path, data, which, gz):
    valid = IMAGES if which == "images" else LABELS
    valid = gzip.compress(valid, mtime=0) if gz else valid
    check_idx(tmp_path / "file", data.draw(mutations(valid)), 3 if which == "images" else 1)


@FUZZ
@given(content=st.binary(max_size=4096))
def test_any_bytes_as_a_cifar_batch(tmp_path, content):
    check_cifar(tmp_path / "data_batch_1", content)


@pytest.mark.slow
@FUZZ
@given(content=st.binary(max_size=512).map(lambda b: b"\x80\x04\x95" + b))
def test_any_protocol_4_stream_as_a_cifar_batch(tmp_path, content):
    check_cifar(tmp_path / "data_batch_1", content)


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(CIFAR))
@FUZZ
@given(data=st.data())
def test_mutated_cifar_batches(tmp_path, data, layout):
    check_cifar(tmp_path / "data_batch_1", data.draw(mutations(CIFAR[layout])))


def test_ci_draws_a_fixed_sequence():
    """CI (which sets CI) draws the same examples each run, so that a CI failure can be reproduced."""
    assert FUZZ.derandomize == bool(os.environ.get("CI"))
