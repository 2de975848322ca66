"""Issue 21, continued from tests/test_writes.py: a checkpoint that is damaged, edited or from another
version is refused in one sentence naming what is wrong, before anything is allocated or written (resume,
eval, sample, export), and messages that once misled say what is so."""
import os

import pytest
import torch

from commands import TRAIN, call, one_line_error, run
from fixtures import tiny_checkpoint


@pytest.fixture(scope="module")
def trained(mnist_root, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained")
    run("imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={run_dir}", "train.max_steps=2")
    return run_dir / "last.pt"


def edit_weights(kind):
    def change(ck):
        w = ck["model"]
        name = "blocks.0.ff.0.weight" if "blocks.0.ff.0.weight" in w else next(k for k in w if k.startswith("blocks"))
        if kind == "missing":
            del w[name]
        elif kind == "extra":
            w["blocks.0.surprise"] = torch.zeros(3)
        else:
            w[name] = torch.zeros(w[name].shape[0] + 1, *w[name].shape[1:])
    return change


def other_model_optimizer(ck):
    groups = ck["optimizer"]["param_groups"]
    groups[0]["params"] = groups[0]["params"][:-2]
    for pid in list(ck["optimizer"]["state"])[-2:]:
        del ck["optimizer"]["state"][pid]


def wrong_moments(ck):
    moments = next(iter(ck["optimizer"]["state"].values()))
    moments["exp_avg"] = torch.zeros(7, 3)


def state(key, value):
    def change(ck):
        ck["state"][key] = value
    return change


def optimizer_lr(ck):
    ck["optimizer"]["param_groups"][0]["lr"] = "fast"


@pytest.mark.parametrize("change,pattern", [
    (edit_weights("missing"), "its weights do not fit the architecture in its own config (missing blocks.0."),
    (edit_weights("extra"), "unexpected blocks.0.surprise"),
    (edit_weights("shape"), "where the model needs"),
    (other_model_optimizer, "it belongs to another model"),
    (wrong_moments, "is (7, 3) where the parameter is"),
    (state("seen", -4), "its run state's seen is -4, not a whole number"),
    (optimizer_lr, "its optimizer's lr is 'fast', not a finite number"),
    (state("epoch", 1.5), "its run state's epoch is 1.5, not a whole number"),
    (state("elapsed", float("inf")), "its run state's elapsed is inf"),
    (state("step", 10 ** 12), "its run state's step is 1000000000000, not a whole number from 0 to"),
])
@pytest.mark.slow
def test_resume_from_a_bad_checkpoint_is_one_sentence(trained, mnist_root, tmp_path, change, pattern):
    ck = torch.load(trained, weights_only=True)
    change(ck)
    torch.save(ck, tmp_path / "last.pt")
    proc = run("imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={tmp_path}", "train.max_steps=4",
               check=False)
    one_line_error(proc, f"{tmp_path / 'last.pt'} is damaged or was edited: ")
    assert pattern in proc.stderr, proc.stderr


def config_change(**model):
    return lambda p: {**p["config"], "model": {**p["config"]["model"], **model}}


@pytest.mark.parametrize("changes,pattern", [
    ({"config": config_change(n_layers=10 ** 9)}, "its config asks for 1000000000 layers but its weights hold 1"),
    ({"config": config_change(d_model=2 ** 17, d_ff=2 ** 19)}, "more than the"),
    ({"config": config_change(attention="softmax", attention_options={"impl": "auto"})},
     "gives softmax attention the option(s) impl, which it does not take"),
    ({"format": "imagegen/2"}, "was written by a newer imagegen (format imagegen/2; this version reads imagegen/1)"),
    ({"format": "imagegen/0"}, "was written by an older imagegen (format imagegen/0"),
])
def test_checkpoints_that_cannot_be_built_are_refused_before_allocating(tmp_path, changes, pattern):
    path = tmp_path / "bad.pt"
    fmt = changes.pop("format", None)
    tiny_checkpoint(path, **changes)
    if fmt:
        ck = torch.load(path, weights_only=True)
        ck["format"] = fmt
        torch.save(ck, path)
    for cmd, extra in (("imagegen-eval", ["split=test"]),
                       ("imagegen-sample", ["num_images=1", f"out={tmp_path}/x.png"]),
                       ("imagegen-export", [f"out={tmp_path / 'site'}"])):
        one_line_error(call(cmd, f"checkpoint={path}", *extra), pattern)


def test_misleading_messages(tmp_path, cifar_root, mnist_root):
    """A folder as checkpoint=; torch's weights_only explanation cut mid-word; compare's key; a CIFAR-10
    checkpoint with an MNIST data.root."""
    run_dir = tmp_path / "run"
    tiny_checkpoint(run_dir / "best.pt")
    tiny_checkpoint(run_dir / "last.pt")
    one_line_error(call("imagegen-eval", f"checkpoint={run_dir}"),
                   f"checkpoint {run_dir} is a folder, not a checkpoint file: it holds best.pt, last.pt")

    class Payload:
        def __reduce__(self):
            return os.system, ("true",)
    bad = tmp_path / "hostile.pt"
    torch.save({"x": Payload()}, bad)
    proc = call("imagegen-eval", f"checkpoint={bad}")
    one_line_error(proc, "asks to import posix.system, which a safe load (weights_only) refuses to run")

    proc = call("imagegen-bench", "mode=compare", f"compare.checkpoints=[{tmp_path / 'nope.pt'}]")
    one_line_error(proc, "pass compare.checkpoints=[a.pt,b.pt,...]")

    from imagegen.data.sets import dataset_info
    from imagegen.model.transformer import build_model
    model = {"attention": "linear", "n_layers": 1, "d_model": 8, "n_heads": 2, "d_ff": 16, "head": "categorical",
             "n_mixtures": 2, "dropout": 0.0, "attention_options": {}}
    cifar = tiny_checkpoint(tmp_path / "cifar.pt", config=lambda p: {**p["config"], "data": {
        **p["config"]["data"], "name": "cifar10"}}, model=build_model(model, dataset_info("cifar10")).state_dict())
    proc = call("imagegen-sample", f"checkpoint={cifar}", "mode=complete", f"data.root={mnist_root}",
               f"out={tmp_path / 'c.png'}")
    one_line_error(proc, "(which holds MNIST files, not CIFAR-10)")
