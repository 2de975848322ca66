"""data=folder end to end: imagegen-data prepare, training, evaluation and completion through the
console scripts; a conversion killed midway; memory flat as the cache grows."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import commands
from commands import call
from fixtures import write_class_folder
from imagegen.data import folder, source

TINY = ["model.n_layers=1", "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "train.batch_size=4",
        "train.val_images=4", "train.sample_every=0", "train.sample_minutes=0", "train.tensorboard=false",
        "train.progress=false", "device=cpu"]


def run(exe, *args, check=True):
    return commands.run(exe, *args, check=check, env={"OMP_NUM_THREADS": "1"}, timeout=600)


@pytest.mark.slow
def test_prepare_train_eval_complete_on_a_folder(tmp_path):
    root = tmp_path / "pics"
    for split, n in (("train", 6), ("test", 2)):
        write_class_folder(root / split, classes=("cat", "dog"), per_class=n, size=(20, 14))
    data = ["data=folder", f"data.root={root}", "data.image_size=8", "data.channels=1", "data.workers=2"]
    grid = tmp_path / "real.png"
    out = run("imagegen-data", "prepare", *data, f"grid={grid}").stdout
    assert "16 images of 8x8x1" in out and "splits: train 11, val 1, test 4" in out, out
    table = [line.split() for line in out.splitlines() if line.strip().startswith(("cat", "dog"))]
    assert [row[0] for row in table] == ["cat", "dog"] and [int(r[1]) + int(r[2]) for r in table] == [6, 6]
    assert [r[3] for r in table] == ["2", "2"], out
    assert grid.exists()
    assert run("imagegen-data", "prepare", *data, "check=true").returncode == 0
    assert run("imagegen-data", "prepare", *data[:-3], "data.image_size=6", "check=true", check=False).returncode == 1

    run_dir = tmp_path / "run"
    proc = run("imagegen-train", *data, f"run_dir={run_dir}", "train.max_steps=3", "model.num_classes=2", *TINY)
    assert "training images of 64 sub-pixels" in proc.stdout + proc.stderr
    ck = run_dir / "last.pt"
    run("imagegen-eval", f"checkpoint={ck}", "device=cpu", "progress=false")
    result = json.loads((run_dir / "last.test.json").read_text())
    assert result["images"] == 4 and result["dims"] == 64 and 0 < result["bits_per_dim"] < 9
    png = tmp_path / "complete.png"
    run("imagegen-sample", f"checkpoint={ck}", "mode=complete", "num_originals=2", "completions=1", f"out={png}",
        "device=cpu", "progress=false")
    assert png.exists()


def test_prepare_errors_are_one_sentence(tmp_path):
    loose = tmp_path / "loose"          # one image, no class folders: the test split takes it (ZeroDivisionError)
    loose.mkdir()
    from PIL import Image
    Image.new("RGB", (8, 8)).save(loose / "a.png")
    for args, pattern in ((["prepare", "data.image_size=8"],
                           "images does not exist; point data.root at a folder of images"),
                          (["prepare", f"data.root={tmp_path}", "data.channels=2"], "data.channels must be 1"),
                          (["bake"], "needs a verb"),
                          (["prepare", f"data.root={tmp_path}", "threads=-1"], "threads must be >= 0"),
                          (["prepare", f"data.root={loose}", "data.image_size=8", "progress=false"],
                           f"the train split of {loose} is empty (1 image in all); add images")):
        proc = call("imagegen-data", *args)
        assert proc.returncode and pattern in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_prepare_grid_keeps_a_file_imagegen_did_not_write(tmp_path):
    root = tmp_path / "pics"
    write_class_folder(root, classes=("cat", "dog"), per_class=3, size=(8, 8))
    data = ["prepare", "data=folder", f"data.root={root}", "data.image_size=4", "progress=false"]
    mine = tmp_path / "real.png"
    mine.write_text("mine")
    proc = call("imagegen-data", *data, f"grid={mine}")
    assert proc.returncode and "overwrite=true" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert mine.read_text() == "mine"
    assert call("imagegen-data", *data, f"grid={mine}", "overwrite=true").returncode == 0
    assert call("imagegen-data", *data, f"grid={mine}").returncode == 0          # ours now: replaced
    from PIL import Image
    assert Image.open(mine).format == "PNG"
    jpg = tmp_path / "real.jpg"
    assert call("imagegen-data", *data, f"grid={jpg}").returncode == 0 and Image.open(jpg).format == "JPEG"
    proc = call("imagegen-data", *data, f"grid={tmp_path / 'real.txt'}")
    assert proc.returncode and "end it in .png" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


SLOW_CONVERT = """
import sys, time
from imagegen.data import folder, source
real = folder.convert
def slow(job):
    time.sleep(0.05)
    return real(job)
folder.convert = slow
source.open_cache({"name": "folder", "root": sys.argv[1], "image_size": 4, "channels": 1, "workers": 1},
                  progress=False)
"""


@pytest.mark.slow
def test_a_killed_conversion_leaves_nothing_a_later_run_takes(tmp_path):
    root = tmp_path / "pics"
    write_class_folder(root, per_class=30)
    d = {"name": "folder", "root": str(root), "image_size": 4, "channels": 1, "workers": 1}
    cache_dir = source.cache_dir(d)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CONVERT, str(root)])
    deadline = time.time() + 60
    while not list(cache_dir.glob(".images-*.tmp")) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)                                        # well inside the 60 x 0.05 s conversion
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(cache_dir.glob(".images-*.tmp")) and not (cache_dir / "manifest.json").exists()
    cache, why = source.open_cache(d, check_only=True)
    assert cache is None and why == "no cache yet"
    cache, _ = source.open_cache(d, progress=False, say=lambda s: None)
    assert len(cache.images) == 60 and not list(cache_dir.glob(".*.tmp"))
    assert np.allclose(np.asarray(cache.images).mean(1), 40 + 80 * cache.labels, atol=3)


MEASURE = """
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, capture_output=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def fake_cache(root, n, side, monkeypatch):
    """A folder of n (empty) image files whose cache holds random pixels: the real build path, with
    the per-image conversion replaced by random bytes (reading a cache is what is measured here)."""
    root.mkdir()
    for i in range(n):
        (root / f"{i:06d}.png").touch()
    length = side * side * 3
    rng = np.random.default_rng(0)
    monkeypatch.setattr(folder, "convert", lambda job: (rng.integers(0, 256, length, np.uint8).tobytes(), None))
    d = {"name": "folder", "root": str(root), "image_size": side, "channels": 3, "workers": 1}
    cache, _ = source.open_cache(d, progress=False, say=lambda s: None)
    assert cache.images.shape == (n, length)
    return d


@pytest.mark.slow
def test_training_memory_stays_flat_as_the_cache_grows_10x(tmp_path, monkeypatch):
    """Peak RSS of imagegen-train (3 steps) on a 15,000-image cache (184 MB) against a 1,500-image one
    (18 MB): the larger run may not hold the pixels it does not use. A run's peak (about 600 MiB)
    varies by +-40 MiB from run to run here, so each size takes the least of three runs, alternating,
    and the bound is half of what the cache grew: a run holding the whole cache would pass it."""
    sizes, peaks = (1500, 15000), {}
    for n in sizes:
        fake_cache(tmp_path / str(n), n, 64, monkeypatch)
    for r in range(3):
        for n in sizes:
            cmd = [str(Path(sys.executable).with_name("imagegen-train")), "data=folder",
                   f"data.root={tmp_path / str(n)}", "data.image_size=64", f"run_dir={tmp_path / f'run{n}-{r}'}",
                   "train.max_steps=3", *TINY, "train.batch_size=2", "train.val_images=2", "train.val_every=1000"]
            out = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
            assert out.returncode == 0, out.stderr
            peaks.setdefault(n, []).append(int(out.stdout.split()[-1]) * 1024)
    least = {n: min(p) for n, p in peaks.items()}
    cache_growth = (sizes[1] - sizes[0]) * 64 * 64 * 3
    print(f"peak RSS {least[1500] / 2**20:.0f} MiB -> {least[15000] / 2**20:.0f} MiB as the cache grew from "
          f"{1500 * 12288 / 2**20:.0f} to {15000 * 12288 / 2**20:.0f} MiB")
    assert least[15000] - least[1500] < cache_growth / 2, peaks


@pytest.mark.slow
def test_torchrun_two_processes_on_a_folder_equal_one(tmp_path):
    """Two ranks start on a folder with no cache: one converts it while the other waits on the lock,
    and the 2-process run equals the 1-process run that follows (which reuses the cache)."""
    from commands import TEN_STEPS, assert_close_runs, torchrun
    root = tmp_path / "pics"
    write_class_folder(root, classes=("a", "b", "c"), per_class=8, size=(9, 9))
    data = ["data=folder", f"data.root={root}", "data.image_size=6", "data.channels=1", "model.num_classes=3",
            "train.label_dropout=0"]     # label dropout draws per rank (as dropout does): no equal runs with it
    two, one = tmp_path / "two", tmp_path / "one"
    proc = torchrun("imagegen.commands.train", *TEN_STEPS, *data, f"run_dir={two}")
    assert (proc.stdout + proc.stderr).count("converted 24 images") == 1, proc.stdout + proc.stderr
    proc = run("imagegen-train", *TEN_STEPS, *data, f"run_dir={one}")
    assert "converted" not in proc.stdout + proc.stderr
    assert_close_runs(one, two)


@pytest.mark.slow
def test_the_64x64_preset_trains_samples_and_exports(tmp_path):
    """preset=cpu_64 at its real size: 64x64 colour images (12,288 sub-pixels) from a folder, two
    training steps, a sampled image, and the browser export of the model."""
    root = tmp_path / "pics"
    write_class_folder(root, classes=("a", "b"), per_class=6, size=(80, 70))
    data = ["data=folder", f"data.root={root}", "data.image_size=64", "data.channels=3", "data.workers=1"]
    run_dir = tmp_path / "run"
    proc = run("imagegen-train", "preset=cpu_64", *data, f"run_dir={run_dir}", "train.max_steps=2",
               "train.val_images=2", "train.sample_every=0", "train.sample_minutes=0", "train.progress=false",
               "threads=1")
    assert "training images of 12288 sub-pixels" in proc.stdout + proc.stderr
    png = tmp_path / "one.png"
    run("imagegen-sample", f"checkpoint={run_dir / 'last.pt'}", "num_images=1", "nrow=1", "scale=1", f"out={png}",
        "progress=false", "threads=1")
    from PIL import Image
    assert Image.open(png).size == (64 + 4, 64 + 4)         # one tile, 2 px of padding around it
    site = tmp_path / "site"
    run("imagegen-export", f"checkpoint={run_dir / 'last.pt'}", f"out={site}", "examples=0")
    config = json.loads((site / "config.json").read_text())
    assert (config["height"], config["width"], config["channels"]) == (64, 64, 3), config
