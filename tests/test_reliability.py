"""Fault injection: stops of every kind resume exactly, one run per run_dir, hostile and damaged
checkpoints, a full disk; each failure is one sentence and loses nothing."""
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from commands import TRAIN, call, logged_steps, one_line_error, run, start, wait_for_step
from fixtures import assert_same_training, tiny_checkpoint

def saved_step(run_dir):
    return torch.load(run_dir / "last.pt", weights_only=True)["state"]["step"]


@pytest.mark.slow
def test_a_stop_request_during_the_last_save_does_not_kill_it(mnist_root, tmp_path):
    """SIGTERM arriving while the run writes its final checkpoints (as when a rank stopped by the other
    rank's signal then gets its own, torchrun having been killed) is taken as a stop request: the
    save completes. Python's default action would end the process mid-save, losing the run's steps."""
    proc = start(tmp_path, mnist_root, "train.max_steps=3", "train.save_every=1000", "train.val_every=1000",
                 term_at_save=1)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, (out, err)
    assert saved_step(tmp_path) == 3


@pytest.mark.slow
def test_every_kind_of_stop_resumes_exactly(mnist_root, tmp_path):
    """SIGTERM, SIGINT, kill -9 at a random step and kill -9 during the checkpoint write, each
    resumed by the same command: parameters and optimizer state end bit-identical to an
    uninterrupted run, and metrics.jsonl holds every step once."""
    steps = 24
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    run("imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={ref}", f"train.max_steps={steps}")

    for resumes, (how, at) in enumerate((("SIGTERM", 3), ("SIGINT", 7), ("SIGKILL", 11))):
        proc = start(cut, mnist_root, f"train.max_steps={steps}")
        wait_for_step(proc, cut, at, resumes)
        proc.send_signal(getattr(signal, how))
        out, err = proc.communicate(timeout=120)
        if how == "SIGKILL":
            assert proc.returncode == -signal.SIGKILL
        else:
            assert proc.returncode != 0 and f"stopped by {how}" in out, (out, err)
            assert err.strip() == "interrupted", err
            assert saved_step(cut) == logged_steps(cut)[-1]      # the saved position is the last trained step

    before = saved_step(cut)
    proc = start(cut, mnist_root, f"train.max_steps={steps}", "train.val_every=1000",   # only last.pt saves
                 kill_at_save=3)                                                   # dies writing its 3rd
    proc.communicate(timeout=240)
    assert proc.returncode == -signal.SIGKILL
    assert list(cut.glob(".last.pt.*.tmp")) and saved_step(cut) == before + 2   # last.pt intact, one step behind

    proc = run("imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={cut}", f"train.max_steps={steps}")
    assert f"resuming {cut / 'last.pt'} at step {before + 2}" in proc.stdout
    assert not list(cut.glob("*.tmp")) and not list(cut.glob(".*.tmp"))     # the dead run's temporary file is gone
    assert_same_training(ref, cut)
    assert logged_steps(cut) == list(range(1, steps + 1))
    rows = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    assert sum(r.get("event") == "resume" for r in rows) == 4


@pytest.mark.slow
def test_second_run_on_a_run_dir_is_refused(mnist_root, tmp_path):
    first = start(tmp_path, mnist_root, "train.max_steps=100000", "train.save_every=50")
    wait_for_step(first, tmp_path, 2)
    second = run("imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={tmp_path}", "train.max_steps=5",
                 check=False)
    one_line_error(second, f"run_dir {tmp_path} is in use by another imagegen process (pid {first.pid}")
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=120)
    assert "stopped by SIGTERM" in out
    assert logged_steps(tmp_path) == list(range(1, saved_step(tmp_path) + 1))   # nothing of the second run


def test_hostile_checkpoint_runs_nothing(tmp_path):
    marker = tmp_path / "marker"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    bad = tmp_path / "hostile.pt"
    torch.save({"format": "imagegen/1", "config": {}, "model": {}, "x": Payload()}, bad)
    one_line_error(call("imagegen-eval", f"checkpoint={bad}"), "is not a readable checkpoint")
    one_line_error(call("imagegen-sample", f"checkpoint={bad}"), "is not a readable checkpoint")
    assert not marker.exists()


def test_a_truncated_last_pt_says_what_imagegen_train_can_do(mnist_root, tmp_path):
    """Resuming from a truncated last.pt said "use another checkpoint, e.g. best.pt", which imagegen-train
    takes no option for; the fix it names then works, and the damaged file is kept."""
    (tmp_path / "last.pt").write_bytes(b"PK\x03\x04 half a checkpoint")
    args = ["imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={tmp_path}", "train.max_steps=1"]
    proc = call(*args)
    one_line_error(proc, f"{tmp_path / 'last.pt'} is not a readable checkpoint")
    assert "start over with train.resume=false train.overwrite=true" in proc.stderr and "best.pt or" not in proc.stderr
    assert call(*args, "train.resume=false", "train.overwrite=true").returncode == 0
    assert [p.read_bytes() for p in tmp_path.glob("previous-*/last.pt")] == [b"PK\x03\x04 half a checkpoint"]


def poisoned(kind):
    def change(payload):
        weights = dict(payload["model"])
        name = next(iter(weights))
        weights[name] = (weights[name].long() if kind == "int" else weights[name].clone().fill_(float("nan")))
        return weights
    return change


@pytest.mark.parametrize("changes,pattern", [
    ({"model": poisoned("nan")}, "holds non-finite weights"),
    ({"model": poisoned("int")}, "holds int64 values where floats belong"),
    ({"config": {"model": {"n_layers": "four"}, "data": {"name": "mnist"}}}, "its model config does not fit"),
    ({"config": {"data": {"name": "mnist"}}}, "lacks the model or data section"),
    ({"config": lambda p: {**p["config"], "model": {**p["config"]["model"], "attention_options": {"impl": "x"}}}},
     "unknown linear attention impl 'x'"),
    ({"model": {"tok.weight": "not a tensor"}}, "not a dict of tensors"),
])
def test_damaged_checkpoints_are_one_sentence(tmp_path, changes, pattern):
    path = tiny_checkpoint(tmp_path / "bad.pt", **changes)
    for cmd, extra in (("imagegen-eval", []), ("imagegen-sample", ["num_images=1"])):
        last = f"out={tmp_path / 'x.png'}" if extra else "split=test"
        one_line_error(call(cmd, f"checkpoint={path}", *extra, last), pattern)


def test_resume_from_a_checkpoint_without_training_state(mnist_root, tmp_path):
    tiny_checkpoint(tmp_path / "last.pt")
    one_line_error(call("imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={tmp_path}",
                       "model.n_layers=1", "model.d_model=8", "model.d_ff=16"),
                   "holds no optimizer state to resume from")


def test_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """A write that fails with ENOSPC (injected: the test cannot count on mounting a tiny tmpfs):
    one sentence, the previous last.pt intact, no temporary file left."""
    import errno

    from imagegen.store import checkpoint
    from imagegen.errors import UserError
    path = tiny_checkpoint(tmp_path / "last.pt")
    before = path.read_bytes()

    def full(obj, f, *args, **kwargs):
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(UserError, match="could not write checkpoint .* \\(the previous checkpoint is intact\\): "
                                        "No space left on device"):
        checkpoint.save(path, {"config": {}, "model": {}})
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_unwritable_run_dir_is_one_sentence(mnist_root, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")   # CI runs as root: the ENOSPC test covers the path
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    one_line_error(call("imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={ro / 'run'}"),
                   "Permission denied")


@pytest.mark.parametrize("cmd,args,pattern", [
    ("imagegen-train", ["model.n_layers=four"], "could not be converted to Integer"),
    ("imagegen-train", ["model.d_model=-8"], "model.d_model must be a positive number, got -8"),
    ("imagegen-train", ["model.n_layers=1e9"], "could not be converted to Integer"),
    ("imagegen-train", ["model.n_layers=1000000000"], "more than the"),
    ("imagegen-train", ["train.batch_size=0"], "train.batch_size must be a positive number, got 0"),
    ("imagegen-train", ["train.batch_size=-1"], "train.batch_size must be a positive number, got -1"),
    ("imagegen-train", ["train.lr=0"], "train.lr must be a positive number"),
    ("imagegen-train", ["train.lr=abc"], "could not be converted to Float"),
    ("imagegen-train", ["train.nope=1"], "unknown option 'train.nope'"),
    ("imagegen-train", ["run_dir=/etc/hostname"], "is a file, not a folder"),
    ("imagegen-sample", ["checkpoint=x.pt", "num_images=0"], "num_images must be a positive number, got 0"),
    ("imagegen-sample", ["checkpoint=x.pt", "num_images=-3"], "num_images must be a positive number, got -3"),
    ("imagegen-sample", ["checkpoint=x.pt", "batch_size=-1"], "batch_size must be a positive number, got -1"),
    ("imagegen-sample", ["checkpoint=x.pt", "batch_size=0"], "batch_size must be a positive number, got 0"),
    ("imagegen-sample", ["model=softmax"], "imagegen-sample takes no model=..."),
    ("imagegen-eval", [], "imagegen-eval needs checkpoint=..."),     # imagegen-sample has a default: mnist-linear
    ("imagegen-sample", ["checkpoint=no-such-model"], "or the name of a shipped model (cifar10-linear, mnist-linear)"),
    ("imagegen-eval", ["checkpoint=x.pt", "batch_size=0"], "batch_size must be a positive number, got 0"),
    ("imagegen-eval", ["checkpoint=x.pt", "max_images=0"], "max_images must be a positive number, got 0"),
    ("imagegen-bench", ["mode=sampling", "preset=small", "sampling.methods=[softmax-kv-cache]",
                        "sampling.step_batches=[64]", "sampling.max_cache_gb=0.001"], "every batch size was skipped"),
])
def test_bad_values_are_one_sentence(cmd, args, pattern, tmp_path, mnist_root, monkeypatch):
    monkeypatch.chdir(tmp_path)
    extra = [f"data.root={mnist_root}", f"run_dir={tmp_path / 'run'}"] if cmd == "imagegen-train" else []
    one_line_error(call(cmd, *extra, *args), pattern)
    assert not (tmp_path / "run" / "last.pt").exists()


def test_sampling_batch_that_cannot_fit_is_refused(tmp_path):
    path = tiny_checkpoint(tmp_path / "m.pt", config=lambda p: {**p["config"], "model": {
        **p["config"]["model"], "attention": "softmax"}}, model=lambda p: build_softmax_weights(p))
    # outputs that fit (the request bound of tests/test_writes.py passes), a batch whose KV cache does not
    one_line_error(call("imagegen-sample", f"checkpoint={path}", "num_images=1000000", "batch_size=1000000", "scale=1",
                       f"out={tmp_path / 'x.png'}"), "lower batch_size")


def build_softmax_weights(payload):
    from imagegen.data.sets import dataset_info
    from imagegen.model.transformer import build_model
    return build_model({**payload["config"]["model"], "attention": "softmax"}, dataset_info("mnist")).state_dict()


@pytest.mark.slow
def test_checkpoint_stores_absolute_data_root(mnist_root, tmp_path):
    rel = os.path.relpath(mnist_root, tmp_path)
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "imagegen-train"), *TRAIN, f"data.root={rel}",
                    "run_dir=run", "train.max_steps=1"], cwd=tmp_path, check=True, capture_output=True)
    ck = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert ck["config"]["data"]["root"] == str(mnist_root) and ck["config"]["run_dir"] == str(tmp_path / "run")
    proc = run("imagegen-eval", f"checkpoint={tmp_path / 'run' / 'last.pt'}", "progress=false")   # from elsewhere
    assert proc.stdout.strip().splitlines()[-1].startswith("bits/dim: ")
