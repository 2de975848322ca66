import gzip
import pickle

import numpy as np
import pytest
import torch

from fixtures import idx_bytes, write_cifar, write_mnist
from imagegen.data import load_split, read_cifar_batch, read_idx
from imagegen.errors import UserError


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_reader_parses_both_encodings(tmp_path, gz):
    written = write_mnist(tmp_path, n_train=10, n_test=7, gz=gz)
    x, y = load_split("mnist", tmp_path, "test")
    assert x.shape == (7, 784) and x.dtype == torch.uint8
    assert np.array_equal(x.numpy(), written["t10k"][0].reshape(7, 784))
    assert np.array_equal(y.numpy(), written["t10k"][1])


def test_mnist_count_comes_from_header(tmp_path):
    write_mnist(tmp_path, n_train=23)
    train, val = load_split("mnist", tmp_path, "train")[0], load_split("mnist", tmp_path, "val")[0]
    assert len(train) + len(val) == 23


def test_split_is_seeded_and_disjoint(mnist_root):
    a = load_split("mnist", mnist_root, "train", seed=3)[0]
    b = load_split("mnist", mnist_root, "train", seed=3)[0]
    v = load_split("mnist", mnist_root, "val", seed=3)[0]
    assert torch.equal(a, b)
    rows = {bytes(r.numpy()) for r in a}
    assert not any(bytes(r.numpy()) in rows for r in v)


def test_truncated_idx_is_rejected(tmp_path):
    path = tmp_path / "x-images-idx3-ubyte"
    path.write_bytes(idx_bytes(np.zeros((4, 28, 28), np.uint8))[:-10])
    with pytest.raises(UserError, match="truncated"):
        read_idx(path, 3)


def test_corrupt_gzip_and_bad_magic_are_rejected(tmp_path):
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros((4, 28, 28), np.uint8)))[:-20])
    with pytest.raises(UserError, match="corrupt gzip"):
        read_idx(path, 3)
    path = tmp_path / "y"
    path.write_bytes(idx_bytes(np.zeros(5, np.uint8)))        # a labels file where images are expected
    with pytest.raises(UserError, match="magic"):
        read_idx(path, 3)


def test_mislabelled_mnist_is_rejected(tmp_path):
    write_mnist(tmp_path, n_test=5)
    (tmp_path / "MNIST/raw/t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(4, np.uint8))))
    with pytest.raises(UserError, match="do not belong together"):
        load_split("mnist", tmp_path, "test")


def test_missing_mnist_names_files_and_fixes(tmp_path):
    with pytest.raises(UserError, match="t10k-images-idx3-ubyte.*data.root.*data.download=true"):
        load_split("mnist", tmp_path, "test")


def test_cifar_reader_interleaves_channels_in_raster_order(tmp_path):
    written = write_cifar(tmp_path, batches=("data_batch_3", "test_batch"), n=5)
    x, y = load_split("cifar10", tmp_path, "test")
    planar = written["test_batch"][0]
    assert x.shape == (5, 3072)
    # sub-pixel 3p + c is channel c of pixel p; planar index is c * 1024 + p
    for p in (0, 1, 517, 1023):
        for c in range(3):
            assert x[2, 3 * p + c] == planar[2, c * 1024 + p]
    assert y.tolist() == written["test_batch"][1]
    # any subset of training batches works (here only data_batch_3)
    train, val = load_split("cifar10", tmp_path, "train")[0], load_split("cifar10", tmp_path, "val")[0]
    assert len(train) + len(val) == 5


def test_bad_cifar_batches_are_rejected(tmp_path):
    path = tmp_path / "data_batch_1"
    write_cifar(tmp_path, batches=("data_batch_1",))
    good = (tmp_path / "cifar-10-batches-py/data_batch_1").read_bytes()
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(UserError, match="not a readable CIFAR-10"):
        read_cifar_batch(path)
    with open(path, "wb") as f:
        pickle.dump({"data": np.zeros((3, 1000), np.uint8), "labels": [0, 1, 2]}, f)
    with pytest.raises(UserError, match="not N x 3072"):
        read_cifar_batch(path)
    with open(path, "wb") as f:
        pickle.dump({"data": np.zeros((3, 3072), np.uint8), "labels": [0, 1]}, f)
    with pytest.raises(UserError, match="3 images but 2 labels"):
        read_cifar_batch(path)


def test_unknown_dataset_lists_choices():
    with pytest.raises(UserError, match="cifar10"):
        load_split("svhn", ".", "test")
