import gzip
import pickle
import tracemalloc

import numpy as np
import pytest
import torch

import imagegen.data.cifar as cifar_module
import imagegen.data.official as official_module
from fixtures import (hostile_cifar_pickle, idx_bytes, one_sentence, py2_cifar_pickle, shared_data, write_cifar,
                      write_mnist)
from imagegen.data.cifar import read_cifar_batch
from imagegen.data.idx import read_idx
from imagegen.data.splits import load_split
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
    with pytest.raises(UserError, match="t10k-images-idx3-ubyte.*data.download=true.*https://.*data.root"):
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


# ---------------------------------------------------------------- hostile and bad files (issue 10)
def test_official_python2_layout_is_read(tmp_path):
    """The official batches are Python 2 pickles naming numpy.core.multiarray, pixels as a py2 str."""
    data = np.random.default_rng(0).integers(0, 256, size=(3, 3072), dtype=np.uint8)
    path = tmp_path / "test_batch"
    path.write_bytes(py2_cifar_pickle(data, [7, 0, 9]))
    x, y = read_cifar_batch(path)
    assert y.tolist() == [7, 0, 9]
    assert np.array_equal(x, data.reshape(3, 3, 1024).transpose(0, 2, 1).reshape(3, 3072))


@pytest.mark.parametrize("protocol", [4, 5])
def test_numpy_re_pickles_read_as_pickle_reads_them(tmp_path, protocol):
    """Batches re-pickled by numpy 1 or 2 (arrays of any byte order, numpy scalar labels) still load."""
    data = np.random.default_rng(0).integers(0, 256, size=(2, 3072), dtype=np.uint8)
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({"data": data, "labels": [np.int64(3), 4]}, protocol=protocol))
    x, y = read_cifar_batch(path)
    assert np.array_equal(x, data.reshape(2, 3, 1024).transpose(0, 2, 1).reshape(2, 3072)) and y.tolist() == [3, 4]
    for a in (np.arange(6, dtype=">f8"), np.arange(6, dtype="<i4").reshape(2, 3), np.array([True, False])):
        path.write_bytes(pickle.dumps({"a": a}, protocol=protocol))
        got = cifar_module._unpickle(path)["a"]
        assert np.array_equal(got, a) and got.dtype == pickle.loads(path.read_bytes())["a"].dtype


def test_real_cifar_files_pass_the_restricted_unpickler():
    x, y = read_cifar_batch(shared_data("cifar10", "cifar-10-batches-py", "test_batch"))
    assert x.shape == (10000, 3072) and sorted(set(y.tolist())) == list(range(10))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_hostile_cifar_batch_is_refused_and_runs_nothing(tmp_path, protocol):
    marker = tmp_path / "marker"
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "test_batch").write_bytes(hostile_cifar_pickle(marker, protocol))
    with pytest.raises(UserError, match="posix.system.*refused") as e:
        load_split("cifar10", tmp_path, "test")
    assert "test_batch" in one_sentence(e)
    assert not marker.exists()


def test_exec_and_eval_globals_are_refused(tmp_path):
    marker = tmp_path / "marker"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()".encode()
    path = tmp_path / "data_batch_1"
    for module, name in (("builtins", "exec"), ("__builtin__", "eval"), ("numpy", "load"), ("os", "system")):
        # protocol 2: {'data': module.name(code)}
        path.write_bytes(b"\x80\x02}(U\x04data" + f"c{module}\n{name}\n".encode()
                         + b"T" + len(code).to_bytes(4, "little") + code + b"\x85Ru.")
        with pytest.raises(UserError, match=f"{module}.{name}") as e:
            read_cifar_batch(path)
        one_sentence(e)
    assert not marker.exists()


@pytest.mark.parametrize("labels", [["cat", "dog"], [0.5, 1.0], [0, 10], [True, False], "01", None])
def test_cifar_labels_that_are_not_integers_are_one_sentence(tmp_path, labels):
    path = tmp_path / "data_batch_1"
    with open(path, "wb") as f:
        pickle.dump({"data": np.zeros((2, 3072), np.uint8), "labels": labels}, f)
    with pytest.raises(UserError, match="labels") as e:
        read_cifar_batch(path)
    one_sentence(e)


def test_cifar_data_of_another_type_is_one_sentence(tmp_path):
    path = tmp_path / "data_batch_1"
    for data in ([[1, 2], [3]], b"\x00" * 3072, np.zeros((2, 3072), np.int64), np.zeros((2, 3072), object)):
        with open(path, "wb") as f:
            pickle.dump({"data": data, "labels": [0, 1]}, f)
        with pytest.raises(UserError, match="not N x 3072 uint8|not numbers") as e:
            read_cifar_batch(path)
        one_sentence(e)


class ForgedDtype:
    """An object dtype whose pickled flags claim it holds no objects."""

    def __reduce__(self):
        return np.dtype, ("O8", False, True), (3, "|", None, None, None, -1, -1, 0)


class ForgedArray:
    """An array of that dtype over bytes of the file: numpy would read those bytes as pointers."""

    def __init__(self, via):
        self.via = via

    def __reduce__(self):
        if self.via == "frombuffer":
            return np.empty(0).__reduce_ex__(5)[0], (bytearray(b"\x41" * 16), ForgedDtype(), (2,), "C")
        return np.empty(0).__reduce__()[0], (np.ndarray, (0,), b"b"), (1, (2,), ForgedDtype(), False, b"\x41" * 16)


@pytest.mark.parametrize("via", ["frombuffer", "reconstruct"])
def test_forged_dtype_flags_cannot_make_numpy_read_pointers(tmp_path, via):
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({"labels": [0, 1], "data": ForgedArray(via)}, protocol=5))
    with pytest.raises(UserError, match="not numbers") as e:
        read_cifar_batch(path)
    one_sentence(e)


def test_gzip_bomb_stops_at_the_promised_size(tmp_path):
    """A .gz whose header promises one image but which inflates to 1 GiB: refused, never inflated."""
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    zeros = gzip.compress(bytes(1 << 20), 9)            # gzip members concatenate into one stream
    path.write_bytes(gzip.compress(idx_bytes(np.zeros((1, 28, 28), np.uint8))) + zeros * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match="padded") as e:
            read_idx(path, 3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    one_sentence(e)
    assert peak < 32 << 20, f"{peak} bytes held to read a 785-byte image"


def test_header_promising_more_than_memory_is_refused(tmp_path):
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(bytes([0, 0, 8, 3]) + (1 << 31).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2))
    with pytest.raises(UserError, match="more than the memory") as e:
        read_idx(path, 3)
    one_sentence(e)


def test_corrupt_deflate_stream_is_one_sentence(tmp_path):
    path = tmp_path / "x.gz"
    good = gzip.compress(idx_bytes(np.arange(4 * 784).reshape(4, 28, 28).astype(np.uint8)))
    path.write_bytes(good[:10] + bytes([0xFF]) * 40 + good[50:])      # header intact, deflate data garbage
    with pytest.raises(UserError, match="corrupt gzip") as e:
        read_idx(path, 3)
    one_sentence(e)


def test_empty_splits_are_one_sentence(tmp_path):
    write_mnist(tmp_path, n_train=1, n_test=0)
    with pytest.raises(UserError, match="test files of mnist .* hold no images") as e:
        load_split("mnist", tmp_path, "test")
    one_sentence(e)
    with pytest.raises(UserError, match="train split of mnist .* is empty.*val_fraction") as e:
        load_split("mnist", tmp_path, "train")
    one_sentence(e)
    with pytest.raises(UserError, match="val_fraction must be") as e:
        load_split("mnist", tmp_path, "val", val_fraction=1.0)
    one_sentence(e)


def test_root_that_is_a_file_is_one_sentence(tmp_path):
    root = tmp_path / "data"
    root.write_text("not a folder")
    for name in ("mnist", "cifar10"):
        with pytest.raises(UserError, match="is a file, not a folder") as e:
            load_split(name, root, "test")
        one_sentence(e)


def test_unreadable_files_are_one_sentence(tmp_path, monkeypatch):
    write_mnist(tmp_path)
    write_cifar(tmp_path)

    def denied(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(official_module, "open", denied, raising=False)     # also when the tests run as root
    for name in ("mnist", "cifar10"):
        with pytest.raises(UserError, match="cannot read .*Permission denied.*permissions") as e:
            load_split(name, tmp_path, "test")
        one_sentence(e)


def test_cifar_batch_of_no_images_is_one_sentence(tmp_path):
    """A batch of 0 images read as an empty set (issue 45)."""
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({"data": np.zeros((0, 3072), np.uint8), "labels": []}, protocol=4))
    with pytest.raises(UserError) as e:
        read_cifar_batch(path)
    assert f"{path} holds no images (a batch of 0)" in one_sentence(e)


@pytest.mark.parametrize("module", ["numpy\n.core", "os\x1b[2Jsystem", "a\u202eb\tc"])
def test_names_read_from_a_pickle_reach_the_message_escaped(tmp_path, module):
    """A pickle naming a module with a newline (or any character that is not printable) put that
    character into the message: found by tests/test_data_fuzz.py (issue 45)."""
    path = tmp_path / "data_batch_1"
    def short(text):                       # SHORT_BINUNICODE
        raw = text.encode()
        return b"\x8c" + bytes([len(raw)]) + raw
    path.write_bytes(b"\x80\x04" + short(module) + short("x") + b"\x93.")   # STACK_GLOBAL module.x
    with pytest.raises(UserError) as e:
        read_cifar_batch(path)
    msg = one_sentence(e)
    assert msg.isprintable() and f"asks to load {module.encode('unicode_escape').decode()}.x" in msg, msg
