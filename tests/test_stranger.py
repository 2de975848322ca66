"""A stranger's machine, round 2 (issue 54): every writer asks first, untrusted names never reach the
terminal raw, every number is checked before it is used. One test (or more) per row of the issue's table,
each failing before its fix."""
import json

import pytest

from commands import call, one_line_error
from fixtures import tiny_checkpoint


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ck") / "m.pt")


# ---------------------------------------------------------------- row 1: convert asks before replacing
def convert(ck, out, *args):
    return call("imagegen-convert", f"checkpoint={ck}", f"out={out}", "check_images=0", "threads=1", *args)


def test_convert_never_replaces_a_users_file_or_a_shipped_model(ck, tmp_path):
    from imagegen.store.shipped import SHIPPED

    mine = tmp_path / "mine.json"
    mine.write_text("x")
    one_line_error(convert(ck, tmp_path / "mine"), f"{mine} exists, and imagegen did not write it")
    assert mine.read_text() == "x" and not (tmp_path / "mine.safetensors").exists()
    assert convert(ck, tmp_path / "mine", "overwrite=true").returncode == 0
    assert convert(ck, tmp_path / "mine").returncode == 0            # its own files: replaced without asking
    shipped = {p: p.read_bytes() for p in SHIPPED.glob("mnist-linear.*")}
    one_line_error(convert(ck, SHIPPED / "mnist-linear", "overwrite=true"),
                   "is a model shipped with imagegen, which is never replaced")
    assert {p: p.read_bytes() for p in SHIPPED.glob("mnist-linear.*")} == shipped


# ---------------------------------------------------------------- row 2: eval's record asks too
def test_eval_never_replaces_a_users_file_named_like_its_record(ck, tmp_path, mnist_root):
    import shutil

    mine = shutil.copy(ck, tmp_path / "m.pt")
    record = tmp_path / "m.test.json"
    record.write_text('{"my": 1}')
    args = (f"checkpoint={mine}", f"data.root={mnist_root}", "max_images=4", "batch_size=4", "progress=false",
            "threads=1")
    one_line_error(call("imagegen-eval", *args), f"{record} exists, and imagegen did not write it")
    assert record.read_text() == '{"my": 1}'
    assert call("imagegen-eval", *args, "overwrite=true").returncode == 0
    assert call("imagegen-eval", *args).returncode == 0               # its own record: replaced without asking
    assert '"bits_per_dim"' in record.read_text()


# ---------------------------------------------------------------- row 12: a refused command leaves nothing
def test_a_failed_train_init_leaves_no_run_folder(mnist_root, tmp_path):
    from commands import TRAIN

    evil = tmp_path / "evil.pt"
    evil.write_bytes(b"not a checkpoint")
    run_dir = tmp_path / "new-run"
    one_line_error(call("imagegen-train", *TRAIN, f"data.root={mnist_root}", "data.download=false",
                        f"run_dir={run_dir}", f"train.init={evil}"), "train.init")
    assert not run_dir.exists()


# ---------------------------------------------------------------- row 3: shapes before values
def test_a_weight_expanded_to_a_trillion_values_is_named_before_it_is_read(tmp_path):
    import torch

    import imagegen
    from fixtures import one_sentence
    from imagegen.errors import UserError

    absurd = tiny_checkpoint(tmp_path / "absurd.pt", model=lambda p: {
        **p["model"], "tok.weight": torch.zeros(1).expand(10 ** 6, 10 ** 6)})
    with pytest.raises(UserError, match=r"tok.weight is \(1000000, 1000000\) where the model needs") as e:
        imagegen.load(absurd)
    one_sentence(e)
    one_line_error(call("imagegen-sample", f"checkpoint={absurd}", f"out={tmp_path / 'x.png'}", "threads=1"),
                   "tok.weight is (1000000, 1000000)")


# ---------------------------------------------------------------- rows 4, 5, 13: every number checked
@pytest.mark.parametrize("arg, says", [
    ("train.lr=nan", "train.lr must be a finite number > 0, got nan"),
    ("train.lr=inf", "train.lr must be a finite number > 0, got inf"),
    ("train.weight_decay=nan", "train.weight_decay must be a finite number >= 0, got nan"),
    ("train.ema=nan", "train.ema must be a finite number in [0, 1)"),
    ("model.dropout=nan", "model.dropout must be a finite number in [0, 1]"),
    ("data.val_fraction=inf", "data.val_fraction must be a finite number in (0, 1)"),
    ("train.betas=[0.9,nan]", "train.betas must be a finite number"),
])
def test_non_finite_training_numbers_are_one_sentence_before_anything_is_written(mnist_root, tmp_path, arg, says):
    from commands import TRAIN

    run_dir = tmp_path / "r1"
    one_line_error(call("imagegen-train", *TRAIN, f"data.root={mnist_root}", "data.download=false",
                        f"run_dir={run_dir}", arg), says)
    assert not run_dir.exists()


def test_a_diverged_run_without_a_checkpoint_names_none(mnist_root, tmp_path):
    from commands import TINY

    proc = call("imagegen-train", "model=linear", *TINY, f"data.root={mnist_root}", "data.download=false",
                f"run_dir={tmp_path / 'r1'}", "train.lr=1e30", "train.warmup_steps=0", "train.max_steps=20")
    one_line_error(proc, "the loss became non-finite")
    assert "last.pt" not in proc.stderr and "no checkpoint was saved yet" in proc.stderr


def test_a_scale_too_large_names_the_scale_that_fits(ck, tmp_path):
    proc = call("imagegen-sample", f"checkpoint={ck}", f"out={tmp_path / 'x.png'}", "scale=1000000", "threads=1")
    one_line_error(proc, "lower the scale (at most about scale=")
    assert "at most about 0" not in proc.stderr


# ---------------------------------------------------------------- row 9: ~ is the home folder
def test_a_tilde_in_a_data_root_or_imagegen_data_is_the_home_folder(mnist_root, tmp_path, monkeypatch):
    import shutil

    import imagegen

    home = tmp_path / "home"
    shutil.copytree(mnist_root, home / "d" / "mnist")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert convert(tiny_checkpoint(tmp_path / "m.pt"), tmp_path / "m", "keep_root=false").returncode == 0
    monkeypatch.setenv("IMAGEGEN_DATA", "~/d")
    model = imagegen.load(tmp_path / "m.safetensors")           # no data root: $IMAGEGEN_DATA/mnist
    for root in (None, "~/d/mnist"):
        x, _ = model.load_split("test", root=root, download=False)
        assert len(x) == 16 and not (tmp_path / "~").exists()


def test_convert_ships_a_train_init_path_as_its_folder_and_file_not_this_machines_path(tmp_path):
    def with_init(payload):
        return {**payload["config"], "train": {"init": str(tmp_path / "run1" / "best.pt")}}

    assert convert(tiny_checkpoint(tmp_path / "m.pt", config=with_init), tmp_path / "m").returncode == 0
    assert json.loads((tmp_path / "m.json").read_text())["config"]["train"]["init"] == "run1/best.pt"


# ---------------------------------------------------------------- row 11: advice that leads somewhere
def test_out_essay_txt_names_the_suffix_first_so_the_advice_works(ck, tmp_path):
    essay = tmp_path / "essay.txt"
    essay.write_text("my essay")
    args = (f"checkpoint={ck}", f"out={essay}", "num_images=4", "nrow=2", "scale=1", "progress=false", "threads=1")
    one_line_error(call("imagegen-sample", *args), "names no image format Pillow writes; end it in .png")
    proc = call("imagegen-sample", *(a.replace("essay.txt", "essay.png") for a in args))   # the advice followed
    assert proc.returncode == 0 and essay.read_text() == "my essay", proc.stderr


# ---------------------------------------------------------------- rows 10, 14: nothing raw reaches the terminal
HOSTILE = ("\x1b[2J\x1b[31mHACKED", "new\nline", "back\rspace")


def no_raw_control(text):
    return all(c.isprintable() or c in "\n" for c in text)


def test_hostile_class_folder_names_are_shown_escaped_and_keep_the_table(tmp_path):
    from fixtures import write_class_folder

    root = tmp_path / "pics"
    write_class_folder(root, classes=HOSTILE, per_class=3)
    proc = call("imagegen-data", "prepare", "data=folder", f"data.root={root}", "data.image_size=8",
                "progress=false", "grid_images=0")
    assert proc.returncode == 0, proc.stderr
    assert no_raw_control(proc.stdout + proc.stderr), proc.stdout
    assert "\\x1b[2J\\x1b[31mHACKED" in proc.stdout and "new\\nline" in proc.stdout
    table = proc.stdout.split("classes (the first level of folders):\n")[1].splitlines()
    assert len(table[0].split()) == len(table[1].split()) == 4          # header and each class: one line, 4 cells


@pytest.mark.parametrize("value", ["a\x1b[31mb.png", "a\nb.png"])
def test_a_control_character_on_the_command_line_is_one_sentence(ck, tmp_path, value):
    proc = call("imagegen-sample", f"checkpoint={ck}", f"out={tmp_path / value}", "threads=1")
    one_line_error(proc, "holds a control character, which no option takes; type it without")
    assert proc.stderr.count("control character") == 1 and no_raw_control(proc.stderr)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- row 6: image_size bounded, memory checked
def test_an_absurd_image_size_is_one_sentence_before_any_file_is_read(tmp_path, monkeypatch):
    import time

    from fixtures import write_class_folder
    from imagegen.data import imagecache
    from imagegen.tuning import machine

    root = tmp_path / "pics"
    write_class_folder(root, per_class=2)
    start = time.perf_counter()
    one_line_error(call("imagegen-data", "prepare", "data=folder", f"data.root={root}", "data.image_size=100000",
                        "progress=false"), "data.image_size must be a whole number of pixels from 1 to 1024")
    assert time.perf_counter() - start < 30 and not (root / ".imagegen-cache").exists()
    monkeypatch.setattr(machine, "available_bytes", lambda device: 2 ** 30)     # 1 GiB free: 1024x1024x3 x 16 fits
    imagecache.check_convert_fits(imagecache.Settings(1024, 1024, 3, "crop", 255), 2)
    monkeypatch.setattr(machine, "available_bytes", lambda device: 2 ** 26)     # 64 MiB free: it does not
    with pytest.raises(Exception, match="would need about 96 MiB, more than the 51 MiB of free memory; pass a "
                                        "smaller data.image_size"):
        imagecache.check_convert_fits(imagecache.Settings(1024, 1024, 3, "crop", 255), 2)


# ---------------------------------------------------------------- row 15: threads= honoured
def test_threads_bounds_the_papers_training_jobs_and_prepares_workers(tmp_path, monkeypatch):
    import os

    from fixtures import write_class_folder
    from imagegen.benchmarks.paper import slots
    from imagegen.config import BenchConfig, typed
    from imagegen.data import imagecache

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)     # a 4-core machine
    monkeypatch.setattr(imagecache, "default_workers", lambda: 4)
    def cfg(threads):
        return typed(BenchConfig, {"mode": "paper", "paper": {"jobs": 0}, "threads": threads})
    assert slots(cfg(1)) == 1 and slots(cfg(0)) == 4
    root = tmp_path / "pics"
    write_class_folder(root, per_class=2)
    proc = call("imagegen-data", "prepare", "data=folder", f"data.root={root}", "data.image_size=8", "threads=1",
                "progress=false", "grid_images=0")
    assert proc.returncode == 0 and "1 worker)" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


# ---------------------------------------------------------------- row 17: the README a stranger reads
def test_the_readme_names_no_path_of_our_machines_and_says_where_chromium_comes_from():
    from pathlib import Path

    text = (Path(__file__).parent.parent / "README.md").read_text()
    assert ".lease" not in text and "is a 5,000-digit subset" not in text and "all 60,000 digits" in text
    install = text.split("## Install")[1].split("\n## ")[0]
    assert "apt-get install chromium" in install and "never `playwright install`" in install


# ---------------------------------------------------------------- the writer rule: bench's tables and plots too
@pytest.mark.slow                  # three comparisons (the speed of each sampler timed)
def test_bench_refuses_a_users_file_in_out_dir_before_measuring(ck, tmp_path, mnist_root):
    out = tmp_path / "bench"
    out.mkdir()
    (out / "compare.md").write_text("my notes")
    args = ("imagegen-bench", "mode=compare", f"compare.checkpoints=[{ck}]", "max_images=4", f"out_dir={out}",
            f"eval_data.root={mnist_root}", "threads=1")
    one_line_error(call(*args), f"{out / 'compare.md'} exists, and imagegen did not write it")
    assert (out / "compare.md").read_text() == "my notes" and not (out / "compare.json").exists()
    assert call(*args, "overwrite=true").returncode == 0
    assert call(*args).returncode == 0                           # its own tables: replaced without asking
    assert "my notes" not in (out / "compare.md").read_text()
