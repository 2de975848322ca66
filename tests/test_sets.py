"""The standard sets data=fashion_mnist and data=cifar100 (issue 23): fixtures in the official layouts read
through the public loaders, bad and hostile files refused in one sentence, downloads from a local server,
and training, evaluation, sampling and imagegen-data prepare through the console scripts."""
import gzip
import io
import pickle
import tarfile

import numpy as np
import pytest
import torch

from commands import TINY, call, one_line_error, run
from fixtures import Server, hostile_cifar_pickle, idx_bytes, leftovers, official_md5s, one_sentence, \
    refused_by_checksum, write_cifar, write_cifar100, write_mnist
from imagegen.data.catalogue import CIFAR10_CLASSES
from imagegen.data.cifar import read_cifar_batch
from imagegen.data.official import OFFICIAL
from imagegen.data.sets import dataset_info, load_from_config
from imagegen.data.splits import load_split
from imagegen.errors import UserError

FASHION = "FashionMNIST/raw"


def planar_to_raster(planar):
    return planar.reshape(-1, 3, 1024).transpose(0, 2, 1).reshape(-1, 3072)


def write_set(name, root, n_train=12, n_test=4):
    if name == "fashion_mnist":
        write_mnist(root, n_train=n_train, n_test=n_test, folder=FASHION)
    else:
        write_cifar100(root, n_train=n_train, n_test=n_test)


def test_dataset_info_of_the_two_sets():
    f, c = dataset_info("fashion_mnist"), dataset_info("cifar100")
    assert (f.height, f.width, f.channels, f.length, f.num_classes) == (28, 28, 1, 784, 10)
    assert f.class_names == ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                             "Bag", "Ankle boot")
    assert (c.height, c.width, c.channels, c.length, c.num_classes) == (32, 32, 3, 3072, 100)
    assert len(set(c.class_names)) == 100
    assert [c.class_names[k] for k in (0, 1, 30, 58, 99)] == ["apple", "aquarium_fish", "dolphin", "pickup_truck",
                                                              "worm"]


# ---------------------------------------------------------------- Fashion-MNIST (IDX files)
@pytest.mark.parametrize("gz", [True, False])
def test_fashion_mnist_reads_its_idx_files(tmp_path, gz):
    written = write_mnist(tmp_path, n_train=20, n_test=6, gz=gz, folder=FASHION)
    x, y = load_split("fashion_mnist", tmp_path, "test")
    assert x.shape == (6, 784) and x.dtype == torch.uint8
    assert np.array_equal(x.numpy(), written["t10k"][0].reshape(6, 784))
    assert np.array_equal(y.numpy(), written["t10k"][1])
    train, val = load_from_config({"name": "fashion_mnist", "root": str(tmp_path), "download": False,
                                   "val_fraction": 0.25, "split_seed": 0}, ("train", "val"))
    assert (len(train), len(val)) == (15, 5)


def test_fashion_mnist_is_not_read_from_mnist_files(tmp_path):
    """MNIST/raw (same file names) is never taken for Fashion-MNIST: the sentence names both and the fix."""
    write_mnist(tmp_path)
    with pytest.raises(UserError, match="Fashion-MNIST not found") as e:
        load_split("fashion_mnist", tmp_path, "test")
    msg = one_sentence(e)
    assert "(which holds MNIST files, not Fashion-MNIST)" in msg and f"{tmp_path}/{FASHION}" in msg
    assert "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/t10k-images-idx3-ubyte.gz" in msg


def test_bad_fashion_mnist_files_are_one_sentence(tmp_path):
    write_mnist(tmp_path, n_test=5, folder=FASHION)
    raw = tmp_path / FASHION
    (raw / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros((5, 32, 32), np.uint8))))
    with pytest.raises(UserError, match=r"not \(28, 28\); it is not Fashion-MNIST") as e:
        load_split("fashion_mnist", tmp_path, "test")
    one_sentence(e)
    (raw / "t10k-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b" + b"\x00" * 30)
    with pytest.raises(UserError, match="corrupt gzip") as e:
        load_split("fashion_mnist", tmp_path, "test")
    one_sentence(e)


# ---------------------------------------------------------------- CIFAR-100 (python pickles)
def test_cifar100_reads_fine_labels_in_raster_order(tmp_path):
    written = write_cifar100(tmp_path, n_train=10, n_test=4)
    x, y = load_split("cifar100", tmp_path, "test")
    assert x.shape == (4, 3072) and x.dtype == torch.uint8
    assert np.array_equal(x.numpy(), planar_to_raster(written["test"][0]))
    assert y.tolist() == written["test"][1]                    # the fine labels, not the coarse ones
    train, val = load_split("cifar100", tmp_path, "train")[0], load_split("cifar100", tmp_path, "val")[0]
    assert len(train) + len(val) == 10
    rows = {bytes(r) for r in planar_to_raster(written["train"][0])}
    assert all(bytes(r.numpy()) in rows for r in torch.cat([train, val]))


def test_cifar100_meta_must_name_its_classes(tmp_path):
    write_cifar100(tmp_path)
    meta = tmp_path / "cifar-100-python" / "meta"
    meta.write_bytes(pickle.dumps({"fine_label_names": list(CIFAR10_CLASSES)}, protocol=2))
    with pytest.raises(UserError, match="does not name CIFAR-100's 100 classes.*apple") as e:
        load_split("cifar100", tmp_path, "test")
    assert str(meta) in one_sentence(e)
    meta.unlink()                                              # train and test suffice
    assert len(load_split("cifar100", tmp_path, "test")[0]) == 4


def test_cifar10_batch_is_not_taken_for_cifar100(tmp_path):
    write_cifar100(tmp_path)
    write_cifar(tmp_path / "c10", batches=("test_batch",), n=3)
    (tmp_path / "cifar-100-python" / "test").write_bytes((tmp_path / "c10/cifar-10-batches-py/test_batch").read_bytes())
    with pytest.raises(UserError, match="not a CIFAR-100 batch .*'fine_labels'") as e:
        load_split("cifar100", tmp_path, "test")
    one_sentence(e)


@pytest.mark.parametrize("fine", [[0, 100], [-1, 3], ["apple", "bee"]])
def test_cifar100_labels_outside_0_to_99_are_one_sentence(tmp_path, fine):
    path = tmp_path / "train"
    path.write_bytes(pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "fine_labels": fine}))
    with pytest.raises(UserError, match="fine_labels that are not a list of integers 0..99") as e:
        read_cifar_batch(path, "cifar100")
    one_sentence(e)


@pytest.mark.parametrize("file", ["test", "meta"])
@pytest.mark.parametrize("protocol", [2, 5])
def test_hostile_cifar100_pickles_are_refused_and_run_nothing(tmp_path, file, protocol):
    write_cifar100(tmp_path)
    marker = tmp_path / "marker"
    (tmp_path / "cifar-100-python" / file).write_bytes(hostile_cifar_pickle(marker, protocol))
    with pytest.raises(UserError, match="posix.system, which no CIFAR-100 file holds; it was refused") as e:
        load_split("cifar100", tmp_path, "test")
    assert f"cifar-100-python/{file}" in one_sentence(e)
    assert not marker.exists()


def test_truncated_cifar100_pickle_is_one_sentence(tmp_path):
    write_cifar100(tmp_path)
    path = tmp_path / "cifar-100-python" / "train"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(UserError, match="is not a readable CIFAR-100 python file") as e:
        load_split("cifar100", tmp_path, "train")
    one_sentence(e)


# ---------------------------------------------------------------- downloads (a local server, no network)
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Fashion-MNIST's four .gz files and cifar-100-python.tar.gz as the official ones are laid out, and what
    they hold."""
    src = tmp_path_factory.mktemp("official")
    fashion = write_mnist(src, n_train=8, n_test=3, folder=FASHION)
    cifar = write_cifar100(src, n_train=6, n_test=3)
    (src / "cifar-100-python" / "file.txt~").write_text("left out")
    served = {p.name: p.read_bytes() for p in (src / FASHION).iterdir()}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(src / "cifar-100-python", arcname="cifar-100-python")
    served["cifar-100-python.tar.gz"] = buf.getvalue()
    return served, fashion, cifar


@pytest.fixture
def server(files, monkeypatch):
    official_md5s(monkeypatch, files[0], "fashion_mnist", "cifar100")
    s = Server(files[0])
    yield s
    s.close()


def test_fashion_mnist_download_through_the_mirror(server, files, tmp_path):
    x, y = load_split("fashion_mnist", tmp_path, "test", download_missing=True, mirror=server.url)
    assert np.array_equal(x.numpy(), files[1]["t10k"][0].reshape(-1, 784))
    assert np.array_equal(y.numpy(), files[1]["t10k"][1])
    assert leftovers(tmp_path) == [f"{FASHION}/t10k-images-idx3-ubyte.gz", f"{FASHION}/t10k-labels-idx1-ubyte.gz"]
    assert all(p.startswith("/mirror/t10k-") for p in server.requests)


def test_cifar100_download_unpacks_the_checked_archive(server, files, tmp_path):
    x, y = load_split("cifar100", tmp_path, "train", download_missing=True, mirror=server.url)
    assert len(x) == 5 and server.requests == ["/mirror/cifar-100-python.tar.gz"]
    assert leftovers(tmp_path) == [f"cifar-100-python/{n}" for n in ("meta", "test", "train")]
    x, y = load_split("cifar100", tmp_path, "test", download_missing=True, mirror=server.url)    # no request
    assert y.tolist() == files[2]["test"][1] and len(server.requests) == 1


@pytest.mark.parametrize("name,split", [("fashion_mnist", "test"), ("cifar100", "train")])
def test_corrupted_download_is_refused_by_its_checksum(server, tmp_path, name, split):
    refused_by_checksum(server, tmp_path, name, split)


def test_the_official_checksums_are_torchvisions():
    """The md5s are torchvision's FashionMNIST and CIFAR100 ones (a typo would refuse every real download)."""
    assert OFFICIAL["fashion_mnist"].md5 == {"train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                                                  "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
                                                  "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
                                                  "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310"}
    assert OFFICIAL["cifar100"].md5 == {"cifar-100-python.tar.gz": "eb9058c3a382ffc7106e4002c42a8d85"}


# ---------------------------------------------------------------- the commands
@pytest.mark.parametrize("name,classes", [("fashion_mnist", 10), ("cifar100", 100)])
def test_num_classes_must_match_the_set(name, classes, tmp_path, monkeypatch):
    write_set(name, tmp_path)
    monkeypatch.chdir(tmp_path)
    one_line_error(call("imagegen-train", f"data={name}", f"data.root={tmp_path}", "model.num_classes=7", *TINY),
                   f"model.num_classes=7, but {name} has {classes} classes; set model.num_classes={classes}")


@pytest.mark.parametrize("name,classes,a_name", [("fashion_mnist", 10, "Ankle boot"), ("cifar100", 100, "willow_tree")])
def test_prepare_prints_the_class_table(name, classes, a_name, tmp_path):
    write_set(name, tmp_path / "data")
    proc = call("imagegen-data", "prepare", f"data={name}", f"data.root={tmp_path / 'data'}", "data.download=false",
                f"grid={tmp_path / 'real.png'}", "grid_images=4")
    assert proc.returncode == 0 and f"{classes} classes:" in proc.stdout and a_name in proc.stdout, proc
    assert (tmp_path / "real.png").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name,classes", [("fashion_mnist", 10), ("cifar100", 100)])
def test_train_eval_sample(name, classes, tmp_path):
    """imagegen-train in its own process; evaluation and sampling of its checkpoint in this one."""
    root, run_dir = tmp_path / "data", tmp_path / "run"
    write_set(name, root)
    run("imagegen-train", f"data={name}", f"data.root={root}", "data.download=false", f"run_dir={run_dir}",
        f"model.num_classes={classes}", "train.max_steps=2", "train.sample_every=0", *TINY)
    ck = torch.load(run_dir / "last.pt", weights_only=True)
    assert ck["state"]["step"] == 2 and ck["config"]["data"]["name"] == name

    proc = call("imagegen-eval", f"checkpoint={run_dir / 'best.pt'}", "progress=false", "threads=1")
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("bits/dim: ") and 0 < float(last.split()[1]) < 9, proc
    proc = call("imagegen-sample", f"checkpoint={run_dir / 'best.pt'}", "labels=[1,99]" if classes == 100 else
                "labels=[1,9]", "nrow=2", "progress=false", "threads=1", f"out={tmp_path / 'grid.png'}")
    assert "(4 tiles, 2 per row)" in proc.stdout and (tmp_path / "grid.png").exists(), proc


@pytest.mark.parametrize("name,given,meant", [
    ("mnist", "", "mnist"),                                   # one folder too high: data/, not data/mnist
    ("mnist", "mnist/MNIST", "mnist"),                        # too low: the set's own folders
    ("mnist", "mnist/MNIST/raw", "mnist"),
    ("cifar10", "", "cifar10"),
    ("cifar10", "cifar10/cifar-10-batches-py", "cifar10")])
def test_data_root_one_folder_off_is_named(name, given, meant, tmp_path):
    """data.root one folder above or below the set's files said only that the files were missing."""
    from fixtures import write_cifar
    (write_mnist if name == "mnist" else write_cifar)(tmp_path / meant)
    (tmp_path / "other").mkdir()
    proc = call("imagegen-data", "prepare", f"data={name}", f"data.root={tmp_path / given}", "data.download=false",
                "grid_images=0")
    one_line_error(proc, f"did you mean data.root={tmp_path / meant} (which holds them)?")
    offline = call("imagegen-data", "prepare", f"data={name}", f"data.root={tmp_path / given}", "grid_images=0")
    assert f"(did you mean data.root={tmp_path / meant}?)" in offline.stderr.splitlines()[-1]   # the mirror is closed


def test_no_near_miss_where_no_folder_holds_the_set(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    proc = call("imagegen-data", "prepare", "data=mnist", f"data.root={tmp_path / 'a'}", "data.download=false")
    one_line_error(proc, "pass data.download=true to fetch them")
    assert "did you mean" not in proc.stderr
