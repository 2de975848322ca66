"""Every argument of the Python API checked by the checker the commands use (config.check_sampling,
config.class_numbers, config.check_device, config.whole): a bad one is one UserError sentence naming it
and the fix, never a raw exception, and never accepted without a word (issue 45)."""
import numpy as np
import pytest
import torch

import imagegen
from commands import call, one_line_error
from fixtures import one_sentence
from imagegen import api
from imagegen.config import MAX_SEED, SampleConfig, check_sample
from imagegen.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return imagegen.load("mnist-linear", threads=None)


@pytest.fixture
def drawn(monkeypatch):
    """The sampling loop replaced by one that records its arguments and returns blank sequences."""
    calls = []

    def fake(module, n, **kw):
        calls.append({"n": n, **kw})
        return torch.zeros(n, module.length, dtype=torch.uint8)
    monkeypatch.setattr(api, "generate", fake)
    return calls


def digits(n=2):
    return np.zeros((n, 28, 28, 1), np.uint8)


def refused(call_, *pieces):
    with pytest.raises(UserError) as e:
        call_()
    msg = one_sentence(e)
    for piece in pieces:
        assert piece in msg, msg
    return msg


@pytest.mark.parametrize("kwargs,pieces", [
    (dict(threads="abc"), ["threads must be >= 0 (a whole number), got 'abc'", "pass threads=N"]),
    (dict(threads=-2), ["threads must be >= 0", "got -2"]),
    (dict(threads=1.5), ["threads must be >= 0", "got 1.5"]),
    (dict(device="gpu9"), ["unknown device 'gpu9'", "use auto, cpu, cuda or cuda:N"]),
])
def test_load_refuses_bad_threads_and_devices(kwargs, pieces):
    refused(lambda: imagegen.load("mnist-linear", **kwargs), *pieces)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch build sees a GPU")
def test_load_on_cuda_without_a_gpu_is_one_sentence():
    refused(lambda: imagegen.load("mnist-linear", device="cuda"), "device=cuda asked for",
            "use device=cpu or device=auto")


def test_load_takes_auto_and_a_torch_device():
    assert imagegen.load("mnist-linear", device="auto", threads=None).device.type == (
        "cuda" if torch.cuda.is_available() else "cpu")
    assert imagegen.load("mnist-linear", device=torch.device("cpu"), threads=None).device.type == "cpu"


@pytest.mark.parametrize("labels,pieces", [
    (["cat"], ["labels holds 'cat', which is neither a class number nor a class name", "0..9"]),
    ([2 ** 70], ["labels holds 1180591620717411303424, which is not a class of this model"]),
    ([[1, 2], [3]], ["labels holds [1, 2], which is neither a class number"]),
    ([1.5], ["labels holds 1.5, which is neither a class number"]),
    ([True], ["labels holds True, which is neither a class number"]),
    ([], ["labels must be one class or a list of them, got []"]),
    ({"a": 1}, ["labels must be one class or a list of them"]),
])
def test_generate_refuses_labels_that_are_not_classes(model, drawn, labels, pieces):
    refused(lambda: model.generate(labels=labels), *pieces)
    assert not drawn


def test_labels_are_class_numbers_of_any_integer_type_or_class_names(drawn):
    cifar = imagegen.load("cifar10-linear", threads=None)
    cifar.generate(labels=["cat", 5, np.int64(0), "airplane"], guidance=1)
    cifar.generate(n=2, labels=torch.tensor([3]), guidance=1)
    assert drawn[0]["labels"].tolist() == [3, 5, 0, 0] and drawn[0]["n"] == 4
    assert drawn[1]["labels"].tolist() == [3] and drawn[1]["n"] == 2     # one for all: the loop repeats it
    refused(lambda: cifar.generate(labels=["kat"]), "labels holds 'kat'", "3: cat")


def test_an_unconditional_model_refuses_labels(model, drawn, monkeypatch):
    monkeypatch.setattr(model.module, "num_classes", 0)
    refused(lambda: model.generate(labels=[3]), "this model is unconditional", "leave out labels=")
    refused(lambda: model.bits_per_dim(digits(1), labels=[3]), "this model is unconditional")


@pytest.mark.parametrize("seed,shown", [(2 ** 70, "1180591620717411303424"), ("a", "'a'"), (1.5, "1.5"), (-1, "-1"),
                                        (MAX_SEED + 1, str(2 ** 64))])
def test_generate_and_complete_refuse_seeds_torch_cannot_take(model, drawn, seed, shown):
    refused(lambda: model.generate(n=1, seed=seed), f"seed must be in 0..2**64-1 (a whole number), got {shown}",
            "pass seed=N")
    refused(lambda: model.complete(digits(), seed=seed), "seed must be in 0..2**64-1")
    assert not drawn


def test_the_largest_seed_is_one_torch_takes(model, drawn):
    torch.Generator().manual_seed(MAX_SEED)          # what the checker allows, torch's generator takes
    model.generate(n=1, seed=MAX_SEED)
    assert drawn[0]["seed"] == MAX_SEED


def test_the_command_and_the_api_refuse_a_seed_in_the_same_words(model, tmp_path):
    with pytest.raises(UserError) as api_error:
        model.generate(n=1, seed=10 ** 20)
    proc = call("imagegen-sample", "seed=100000000000000000000", f"out={tmp_path / 'x.png'}")
    one_line_error(proc, str(api_error.value))
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("kwargs,pieces", [
    (dict(images=np.zeros((0, 28, 28, 1))), ["images holds no image (shape (0, 28, 28, 1)); pass at least one"]),
    (dict(images=digits(), rows=2.5), ["rows must be in 0..28 (a whole number), got 2.5"]),
    (dict(images=digits(), rows="a"), ["rows must be in 0..28 (a whole number), got 'a'"]),
    (dict(images=digits(), rows=29), ["rows must be in 0..28", "got 29"]),
    (dict(images=digits(), labels=[1, 2, 3]), ["give one label per image (or one for all): 2 images but 3 labels"]),
    (dict(images="abc"), ["images must be a numpy array (N, 28, 28, 1) uint8, got 'abc'"]),
    (dict(images=[[1, 2], [3]]), ["images must be a numpy array (N, 28, 28, 1) uint8"]),
])
def test_complete_refuses_bad_arguments(model, drawn, kwargs, pieces):
    refused(lambda: model.complete(**kwargs), *pieces)
    assert not drawn


def test_complete_passes_the_labels_of_the_images_to_each_completion(model, drawn):
    out = model.complete(digits(), n=3, labels=[7, 4])
    assert out.shape == (2, 3, 28, 28, 1)
    assert drawn[0]["labels"].tolist() == [7, 7, 7, 4, 4, 4] and drawn[0]["n"] == 6
    model.complete(digits(), n=2, labels=7)                      # one for all
    assert drawn[1]["labels"].tolist() == [7] * 4


@pytest.mark.parametrize("kwargs,pieces", [
    (dict(images=np.zeros((0, 28, 28, 1), np.uint8)), ["images holds no image"]),
    (dict(images=digits(1), batch_size=0), ["batch_size must be a positive number, got 0"]),
    (dict(images=digits(1), batch_size="x"), ["batch_size must be a positive number, got 'x'"]),
    (dict(images=digits(1), batch_size=-1), ["batch_size must be a positive number, got -1"]),
])
def test_bits_per_dim_refuses_bad_arguments(model, kwargs, pieces):
    refused(lambda: model.bits_per_dim(**kwargs), *pieces)


def test_bits_per_dim_without_labels_says_what_it_scored(model, capsys):
    without = model.bits_per_dim(digits(1))
    err = capsys.readouterr().err
    assert "bits_per_dim scored p(x | no label)" in err and len(err.strip().splitlines()) == 1, err
    assert np.isfinite(without)
    assert model.bits_per_dim(digits(1), labels=[3]) != without and capsys.readouterr().err == ""


@pytest.mark.parametrize("kwargs,pieces", [
    (dict(images=digits(), scale=10 ** 6), ["a grid of 2 images at scale=1,000,000 would need about",
                                            "lower scale (at most about"]),
    (dict(images="abc"), ["images must be a numpy array (N, 28, 28, 1) uint8 or (B, n, ...) from complete"]),
    (dict(images=np.zeros((0, 28, 28, 1), np.uint8)), ["images holds no image"]),
    (dict(images=np.full((2, 28, 28, 1), 0.5)), ["images must hold whole numbers in 0..255 (uint8 pixels)",
                                                 "np.round(images * 255).astype(np.uint8)"]),
    (dict(images=digits(), nrow=2.5), ["nrow must be a positive number, got 2.5"]),
])
def test_grid_refuses_bad_arguments_before_allocating(model, kwargs, pieces):
    refused(lambda: model.grid(**kwargs), *pieces)


def test_grid_tiles_what_complete_returns_a_row_per_original(model):
    halves = model.complete(np.full((2, 28, 28, 1), 255, np.uint8), rows=27, n=3)
    picture = model.grid(halves, scale=1)
    assert picture.size == (3 * 30 + 2, 2 * 30 + 2)              # n=3 per row, a row per original
    assert model.grid(halves, nrow=6, scale=1).size == (6 * 30 + 2, 30 + 2)
    assert model.grid(halves[0], scale=1).size == (3 * 30 + 2, 30 + 2)


def test_the_command_takes_class_names_as_the_api_does():
    from imagegen.commands.sample import labels_given
    from imagegen.data.sets import dataset_info

    names = dataset_info({"name": "cifar10"}).class_names
    check_sample(SampleConfig(num_images=2, num_originals=1, completions=1, nrow=2, scale=1, batch_size=2,
                              labels=["cat", 5]))
    cfg = labels_given(SampleConfig(labels=["cat", 5]), 10, names)
    assert cfg.labels == [3, 5]
    with pytest.raises(UserError) as e:
        labels_given(SampleConfig(labels=["kat"]), 10, names)
    assert "labels holds 'kat', which is neither a class number nor a class name" in one_sentence(e)
