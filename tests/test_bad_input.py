"""Bad input to sampling, through the Python API and imagegen-sample: each refused with one sentence
naming the problem and the fix, before any work (issue 33, "sharp edges")."""
import math

import numpy as np
import pytest
import torch

import imagegen
from commands import call, one_line_error
from fixtures import one_sentence
from imagegen.errors import UserError
from imagegen.tuning.choice import Choice


@pytest.fixture(scope="module")
def model():
    return imagegen.load("mnist-linear")


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(guidance=math.nan), "guidance must be a finite number >= 0, got nan"),
    (dict(guidance=math.inf), "guidance must be a finite number >= 0, got inf"),
    (dict(guidance=100), "guidance must be at most 12, got 100: past 12 it stops helping"),   # streaked noise, exit 0
    (dict(temperature=math.nan), "temperature must be a finite number > 0, got nan"),
    (dict(temperature=math.inf), "temperature must be a finite number > 0, got inf"),
    (dict(n=-1), "n must be a positive number, got -1"),
    (dict(n=1, batch_size=0), "batch_size must be a positive number, got 0"),
    (dict(n=10 ** 9), "n=1,000,000,000 would need about"),
])
def test_generate_refuses_bad_numbers(model, kwargs, pattern):
    with pytest.raises(UserError) as e:
        model.generate(labels=[1], **kwargs)
    assert pattern in one_sentence(e)


def test_complete_and_grid_refuse_bad_numbers(model):
    images = np.zeros((1, 28, 28, 1), np.uint8)
    with pytest.raises(UserError) as e:
        model.complete(images, n=-1)
    assert "n must be a positive number, got -1" in one_sentence(e)
    with pytest.raises(UserError) as e:
        model.complete(images, n=10 ** 9)
    assert "would need about" in one_sentence(e)
    with pytest.raises(UserError) as e:
        model.grid(images, nrow=0)
    assert "nrow must be a positive number, got 0" in one_sentence(e)


@pytest.mark.parametrize("value", [0.5, -1.0, 256.0, math.nan])
def test_complete_refuses_float_images_that_are_not_bytes(model, value):
    images = np.zeros((1, 28, 28, 1), np.float32)
    images[0, 3, 4] = value
    with pytest.raises(UserError) as e:
        model.complete(images, n=1)
    assert f"images must hold whole numbers in 0..255 (uint8 pixels), got float32 values such as {value}" \
        in one_sentence(e)


def test_complete_takes_float_images_of_whole_bytes(model):
    images = np.full((1, 28, 28, 1), 255.0)
    out = model.complete(images, rows=27, n=1)
    assert out.shape == (1, 1, 28, 28, 1) and (out[0, 0, :27] == 255).all()


@pytest.mark.parametrize("arg,pattern", [
    ("guidance=nan", "guidance must be a finite number >= 0, got nan"),
    ("guidance=inf", "guidance must be a finite number >= 0, got inf"),
    ("guidance=1e9", "guidance must be at most 12, got 1e+09: past 12 it stops helping"),
    ("temperature=nan", "temperature must be a finite number > 0, got nan"),
])
def test_sample_refuses_nan_and_inf(tmp_path, arg, pattern):
    proc = call("imagegen-sample", arg, f"out={tmp_path / 'x.png'}")
    one_line_error(proc, pattern)
    assert not (tmp_path / "x.png").exists()


def test_sample_size_check_counts_a_row_per_class(tmp_path):
    """labels=auto on the class-conditional shipped model draws nrow x 10 images: the check counts
    those (it counted num_images, and the command then tried to allocate 784 GB)."""
    proc = call("imagegen-sample", "nrow=100000000", f"out={tmp_path / 'x.png'}")
    one_line_error(proc, "nrow=100,000,000 images for each of 10 label rows would need about")
    assert "at most about nrow=" in proc.stderr


def test_sample_says_labels_auto_draws_a_row_per_class(tmp_path, monkeypatch):
    from imagegen import api
    monkeypatch.setattr(api, "generate", lambda model, n, **kw: torch.zeros(n, 784, dtype=torch.uint8))
    proc = call("imagegen-sample", "num_images=2", "threads=1", "scale=1", f"out={tmp_path / 'x.png'}")
    assert proc.returncode == 0, proc.stderr
    line = ("labels=auto: a row of nrow=8 images for each of the 10 classes (80 in all, not num_images); for "
            "num_images images pass label=N or labels=none.")
    assert line in " ".join(proc.stdout.split()), proc.stdout      # folded into short lines


@pytest.mark.parametrize("args,pattern", [
    (["labels=[99]", "num_images=2"], "labels holds 99, which is not a class of this model; use class numbers 0..9."),
    (["labels=[3,-2]"], "labels holds -2, which is not a class of this model; use class numbers 0..9"),
    (["label=12"], "label holds 12, which is not a class of this model; use class numbers 0..9"),
])
def test_sample_names_the_bad_class_before_any_work(tmp_path, monkeypatch, args, pattern):
    """Refused right after the model is read: nothing decided or sampled, nothing printed before (the thread
    probe's line was)."""
    from imagegen import api

    def no_work(*a, **kw):
        raise AssertionError("precision or samples were worked out before the labels were checked")
    monkeypatch.setattr(api, "decide_precision", no_work)
    monkeypatch.setattr(api, "generate", no_work)
    proc = call("imagegen-sample", *args, f"out={tmp_path / 'x.png'}")
    one_line_error(proc, pattern)
    assert proc.stdout == ""


def test_api_names_the_bad_class(model):
    with pytest.raises(UserError) as e:
        model.generate(n=2, labels=[99])
    assert "labels holds 99, which is not a class of this model; use class numbers 0..9" in one_sentence(e)


def test_bad_class_sentence_names_the_classes():
    from imagegen.config import check_classes
    from imagegen.data.sets import dataset_info
    with pytest.raises(UserError) as e:
        check_classes([3, 10], dataset_info({"name": "fashion_mnist"}).class_names)
    assert "labels holds 10, which is not a class of this model; use class numbers 0..9 (0: T-shirt/top, 1: " \
        "Trouser," in one_sentence(e)


# ---------------------------------------------------------------- checkpoints and out= that mislead
def shipped_with(path, **weights):
    """The shipped model saved as a .pt checkpoint at path, with some weights replaced."""
    from imagegen.store import checkpoint
    ck = checkpoint.load("mnist-linear")
    checkpoint.save(path, {"config": ck["config"], "model": {**ck["model"], **weights}})
    return path


@pytest.mark.parametrize("cmd,extra", [("imagegen-sample", ["num_images=1", "out=x.png"]), ("imagegen-eval", []),
                                       ("imagegen-export", ["out=site"])])
def test_weight_of_the_wrong_shape_is_named_with_both_shapes(tmp_path, monkeypatch, cmd, extra):
    """Every command that builds the model names the parameter and both shapes (eval, sample and export
    said "(Error(s) in loading state_dict for PixelTransformer:)", the detail cut)."""
    monkeypatch.chdir(tmp_path)
    bad = shipped_with(tmp_path / "bad.pt", **{"proj.bias": torch.zeros(7, 5)})
    one_line_error(call(cmd, f"checkpoint={bad}", *extra), "proj.bias is (7, 5) where the model needs (256)")


def test_weights_out_of_range_are_an_edited_file_and_non_finite_ones_a_diverged_run(tmp_path):
    """A weight of 3e38 (finite) sampled silently; NaN in a .safetensors model, which imagegen-convert
    never writes, was called a run that diverged."""
    from imagegen.store import checkpoint, shipped
    big = shipped_with(tmp_path / "big.pt", **{"proj.bias": torch.full((256,), 3e38)})
    one_line_error(call("imagegen-sample", f"checkpoint={big}", f"out={tmp_path / 'x.png'}"),
                   f"{big} is damaged or was edited: weight proj.bias holds 3e+38, out of range")
    nan = shipped_with(tmp_path / "nan.pt", **{"proj.bias": torch.full((256,), math.nan)})
    one_line_error(call("imagegen-sample", f"checkpoint={nan}", f"out={tmp_path / 'x.png'}"),
                   "holds non-finite weights (NaN or inf in proj.bias): the run diverged before this save")
    ck = checkpoint.load("mnist-linear")
    stem = tmp_path / "nan"
    shipped.write(stem, ck["config"], {**ck["model"], "proj.bias": torch.full((256,), math.nan)}, {"guidance": 1.0})
    proc = call("imagegen-sample", f"checkpoint={stem}.safetensors", f"out={tmp_path / 'x.png'}")
    one_line_error(proc, f"{stem}.safetensors is damaged or was edited: weight proj.bias holds NaN or inf, which "
                         f"imagegen-convert never writes; convert the run's best.pt again")
    assert "diverged" not in proc.stderr


def test_plain_pickle_and_random_bytes_are_not_checkpoints(tmp_path):
    import pickle
    import warnings
    (tmp_path / "pickle.pt").write_bytes(pickle.dumps({"a": 1}, protocol=4))
    for seed in range(3):
        (tmp_path / f"random{seed}.pt").write_bytes(np.random.default_rng(seed).bytes(4096))
    for name in ("pickle.pt", "random0.pt", "random1.pt", "random2.pt"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            proc = call("imagegen-sample", f"checkpoint={tmp_path / name}", f"out={tmp_path / 'x.png'}")
        assert not [w for w in caught if "pickle protocol" in str(w.message)]
        assert "pickle protocol" not in proc.stderr
        one_line_error(proc, f"{tmp_path / name} is not a readable checkpoint (truncated or not written by imagegen: "
                             f"it is another kind of file, or damaged)")


def test_out_naming_a_folder_or_under_a_file(tmp_path):
    (tmp_path / "folder").mkdir()
    proc = call("imagegen-sample", f"out={tmp_path / 'folder'}")
    one_line_error(proc, f"{tmp_path / 'folder'} is a folder, and the sample grid is a file; give a file name "
                         f"instead, e.g. {tmp_path / 'folder' / 'grid.png'}")
    (tmp_path / "file").write_text("x")
    proc = call("imagegen-sample", f"out={tmp_path / 'file' / 'sub' / 'x.png'}")
    one_line_error(proc, f"{tmp_path / 'file' / 'sub' / 'x.png'} cannot be written: {tmp_path / 'file'} is a file, "
                         f"not a folder")
    assert proc.stdout == ""                   # refused before any work


def test_writes_refuse_a_folder_where_the_file_goes(tmp_path):
    from imagegen.files import write_bytes
    (tmp_path / "x.json").mkdir()
    with pytest.raises(UserError) as e:
        write_bytes(tmp_path / "x.json", b"{}", "result")
    assert f"{tmp_path / 'x.json'} is a folder, and the result is a file" in one_sentence(e)


# ---------------------------------------------------------------- sizes past the data or the memory (issue 45)
@pytest.mark.parametrize("context,data,length", [(1000000000, "mnist", 784), (784, "mnist", 784),
                                                 (3072, "cifar10", 3072)])
def test_context_past_the_sequence_is_refused_before_the_model(tmp_path, context, data, length):
    """model.context=[1000000000] allocated 64 GB, then a traceback; [784] on MNIST's 784 sub-pixels
    trained an embedding that never sees a byte."""
    proc = call("imagegen-train", f"data={data}", f"model.context=[5,{context}]", f"run_dir={tmp_path / 'run'}",
                "threads=1")
    one_line_error(proc, f"model.context holds {context}, but an image of this data is {length} sub-pixels long, so "
                         f"that distance never reaches a byte; use distances from 2 to {length - 1}.")
    assert not (tmp_path / "run").exists()


def test_the_longest_context_that_reads_a_byte_is_taken():
    from dataclasses import asdict

    from imagegen.config import ModelConfig, check_model
    check_model({**asdict(ModelConfig()), "context": [2, 783]}, length=784)     # x_0 at position 783
    with pytest.raises(UserError):
        check_model({**asdict(ModelConfig()), "context": [2, 784]}, length=784)


def test_guidance_up_to_the_largest_is_taken():
    from imagegen.config import check_sampling
    check_sampling(guidance=12)
    check_sampling(guidance=0)
    with pytest.raises(UserError):
        check_sampling(guidance=12.5)


def test_sample_runs_at_the_batch_it_draws(tmp_path, monkeypatch):
    """num_images=2 batch_size=1000000000: precision=auto timed products at batch 10^9 (512 GB, a traceback)."""
    from imagegen import api
    asked = {}
    monkeypatch.setattr(api, "decide_precision", lambda s, d, **kw: asked.update(kw) or Choice(torch.float32))
    monkeypatch.setattr(api, "generate", lambda model, n, **kw: asked.update(batch_size=kw["batch_size"])
                        or torch.zeros(n, 784, dtype=torch.uint8))
    proc = call("imagegen-sample", "num_images=2", "batch_size=1000000000", "labels=none", "threads=1", "scale=1",
                f"out={tmp_path / 'x.png'}")
    assert proc.returncode == 0, proc.stderr
    assert asked["batch"] == 2 and asked["batch_size"] == 2 and "sampler, batch 2," in proc.stdout


def test_batches_past_the_memory_are_one_sentence_before_any_work(tmp_path, monkeypatch, mnist_root):
    """A batch that cannot fit: sampling, scoring (imagegen-eval, the API's bits_per_dim) and training
    each refuse it in one sentence (100 MB free here)."""
    from imagegen import memory
    from imagegen import api
    monkeypatch.setattr(memory, "available_bytes", lambda device: 100 * 2**20)
    monkeypatch.setattr(api, "generate", lambda *a, **kw: pytest.fail("sampled"))
    proc = call("imagegen-sample", "num_images=2000", "batch_size=5000", "labels=none", "precision=float32", "scale=1",
                f"out={tmp_path / 'x.png'}")
    one_line_error(proc, "batch_size=5000 (2000 images at once) would need about")
    assert "GiB for sampling, more than the 0.1 GiB free; lower batch_size (about" in proc.stderr
    proc = call("imagegen-eval", "checkpoint=mnist-linear", f"data.root={mnist_root}", "batch_size=1000000000",
                "progress=false")
    one_line_error(proc, "batch_size=1000000000 (16 images at once) would need about")   # the fixture's 16
    assert "GiB for scoring the images" in proc.stderr
    with pytest.raises(UserError) as e:
        imagegen.load("mnist-linear").bits_per_dim(np.zeros((64, 28, 28, 1), np.uint8), labels=[1] * 64,
                                                   batch_size=64)
    assert "batch_size=64 would need about" in one_sentence(e)
    proc = call("imagegen-train", "data=mnist", f"data.root={mnist_root}", "train.batch_size=32", "threads=1",
                f"run_dir={tmp_path / 'run'}", "train.progress=false")
    one_line_error(proc, "train.batch_size=32 would need about")
    assert "GiB for training" in proc.stderr
