"""First-run download against a local HTTP server on 127.0.0.1 serving fixture files in the
official layout (the md5 constants patched to the fixtures'): good, corrupted, cut and offline."""
import io
import os
import socket
import sys
import tarfile
import types

import numpy as np
import pytest

import imagegen.data.download as download_module
from fixtures import Server, leftovers, official_md5s, refused_by_checksum, shared_data, one_sentence, \
    write_cifar, write_mnist
from imagegen.data.sets import load_from_config
from imagegen.data.splits import load_split
from imagegen.errors import UserError


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """Fixture files under their official names, and what they hold."""
    src = tmp_path_factory.mktemp("official")
    mnist = write_mnist(src, n_train=12, n_test=5)
    cifar = write_cifar(src, batches=("data_batch_1", "data_batch_2", "test_batch"), n=4)
    files = {p.name: p.read_bytes() for p in (src / "MNIST" / "raw").iterdir()}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(src / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    files["cifar-10-python.tar.gz"] = buf.getvalue()
    return files, mnist, cifar


@pytest.fixture
def server(official, monkeypatch):
    files = official[0]
    official_md5s(monkeypatch, files, "mnist", "cifar10")
    s = Server(files)
    yield s
    s.close()


def test_good_download_fetches_only_what_the_split_needs(server, official, tmp_path):
    x, y = load_split("mnist", tmp_path, "test", download_missing=True, mirror=server.url)
    images, labels = official[1]["t10k"]
    assert np.array_equal(x.numpy(), images.reshape(-1, 784)) and np.array_equal(y.numpy(), labels)
    assert leftovers(tmp_path) == ["MNIST/raw/t10k-images-idx3-ubyte.gz", "MNIST/raw/t10k-labels-idx1-ubyte.gz"]
    n = len(server.requests)
    load_split("mnist", tmp_path, "test", download_missing=True, mirror=server.url)   # present: no request
    assert len(server.requests) == n


def test_mirror_from_the_config(server, official, tmp_path):
    cfg = {"name": "mnist", "root": str(tmp_path), "download": True, "mirror": server.url, "val_fraction": 0.25,
           "split_seed": 0}
    train, val = load_from_config(cfg, ("train", "val"))
    assert len(train) + len(val) == 12
    assert server.requests and all(p.startswith("/mirror/train-") for p in server.requests)


def test_cifar_download_unpacks_the_checked_archive(server, official, tmp_path):
    x, y = load_split("cifar10", tmp_path, "test", download_missing=True, mirror=server.url)
    assert y.tolist() == official[2]["test_batch"][1]
    assert leftovers(tmp_path) == [f"cifar-10-batches-py/{n}" for n in ("data_batch_1", "data_batch_2", "test_batch")]


@pytest.mark.parametrize("name,split", [("mnist", "test"), ("cifar10", "train")])
def test_corrupted_file_is_refused_by_its_checksum(server, tmp_path, name, split):
    refused_by_checksum(server, tmp_path, name, split)


@pytest.mark.parametrize("mode", ["cut", "cut-unsized"])
def test_cut_transfer_leaves_nothing_and_the_next_run_fetches_again(server, official, tmp_path, mode):
    server.mode = mode
    with pytest.raises(UserError, match="cut after|md5") as e:
        load_split("mnist", tmp_path, "test", download_missing=True, mirror=server.url)
    assert "nothing was kept" in one_sentence(e)
    assert leftovers(tmp_path) == []
    server.mode = "ok"
    x, _ = load_split("mnist", tmp_path, "test", download_missing=True, mirror=server.url)
    assert np.array_equal(x.numpy(), official[1]["t10k"][0].reshape(-1, 784))


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_offline_is_one_sentence_naming_files_root_and_fix(tmp_path, name):
    root = tmp_path / "data"
    mirror = f"http://127.0.0.1:{closed_port()}/"
    with pytest.raises(UserError, match="not found in .* could not be downloaded .* by hand into") as e:
        load_split(name, root, "test", download_missing=True, mirror=mirror)
    msg = one_sentence(e)
    assert str(root) in msg
    files = (["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"] if name == "mnist"
             else ["cifar-10-python.tar.gz"])
    assert all(mirror + f in msg for f in files)
    assert not root.exists()                                                         # nothing created


def test_missing_file_on_the_mirror_is_one_sentence(server, tmp_path):
    server.files = {}
    with pytest.raises(UserError, match="HTTP 404") as e:
        load_split("mnist", tmp_path, "test", download_missing=True, mirror=server.url)
    one_sentence(e)


def test_download_false_never_fetches(server, tmp_path):
    with pytest.raises(UserError, match="MNIST not found.*data.download=true"):
        load_split("mnist", tmp_path, "test", download_missing=False, mirror=server.url)
    assert server.requests == []


def test_torchvision_is_never_used(server, tmp_path, monkeypatch):
    """An importable torchvision (which downloads without these guarantees) is not called."""
    fake = types.ModuleType("torchvision")
    fake.datasets = types.ModuleType("torchvision.datasets")

    def refuse(*args, **kwargs):
        raise AssertionError("torchvision called")
    fake.datasets.MNIST = fake.datasets.CIFAR10 = refuse
    monkeypatch.setitem(sys.modules, "torchvision", fake)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", fake.datasets)
    x, _ = load_split("mnist", tmp_path, "test", download_missing=True, mirror=server.url)
    assert len(x) == 5 and server.requests


def test_interrupted_download_removes_its_temporary_file(server, tmp_path, monkeypatch):
    def interrupted(path):
        raise KeyboardInterrupt
    monkeypatch.setattr(download_module, "_md5", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load_split("mnist", tmp_path, "test", download_missing=True, mirror=server.url)
    assert leftovers(tmp_path) == []
    assert not any(name.endswith(".part") for _, _, names in os.walk(tmp_path) for name in names)




def test_official_test_files_pass_the_official_checksums(tmp_path):
    """The official MNIST test files (byte-identical copies) served locally, checked by the real md5s."""
    raw = shared_data("mnist", "MNIST", "raw")
    s = Server({name: (raw / name).read_bytes() for name in ("t10k-images-idx3-ubyte.gz",
                                                                     "t10k-labels-idx1-ubyte.gz")})
    try:
        x, y = load_split("mnist", tmp_path, "test", download_missing=True, mirror=s.url)
    finally:
        s.close()
    assert x.shape == (10000, 784) and sorted(set(y.tolist())) == list(range(10))
