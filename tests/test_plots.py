"""matplotlib figures: the sampling benchmark's latency plot for any sweep, training curves of runs."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from imagegen import plots
from imagegen.benchmarks.sampling import plot_latency
from imagegen.errors import UserError

TINY = ["model.n_layers=1", "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_mixtures=2"]


def fake_sweep(batches, methods=("linear-recurrent", "softmax-kv-cache")):
    positions = [0, 100, 400, 783]
    curves = {f"{m}@{b}": [0.001 * b * (1 + i * (m == "softmax-kv-cache")) for i in range(len(positions))]
              for m in methods for b in batches}
    return {"positions": positions, "curves": curves}


def drawn(path):
    """The PNG opens, and holds lines in matplotlib's first two colours (C0 blue, C1 orange)."""
    img = np.asarray(Image.open(path).convert("RGB")).astype(int)
    assert img.shape[0] > 200 and img.shape[1] > 300
    for colour in ((31, 119, 180), (255, 127, 14)):
        assert (np.abs(img - colour).sum(axis=2) < 30).sum() > 50, colour
    return img


@pytest.mark.parametrize("batches,title", [([1, 16, 64, 256], "batch 64"), ([1, 16], "batch 16"),
                                           ([128, 1], "batch 128")])
def test_latency_plot_written_for_any_sweep(tmp_path, capsys, batches, title):
    path = plot_latency(tmp_path / "latency.png", fake_sweep(batches), 64, title="latency")
    drawn(path)
    out = capsys.readouterr().out
    assert f"wrote {path}" in out
    assert ("not measured" in out) == (64 not in batches)


def test_latency_plot_mixed_batches_and_log_scale(tmp_path, capsys):
    result = fake_sweep([1, 16], methods=("linear-recurrent",))
    result["curves"]["softmax-kv-cache@256"] = [0.01, 0.02, 0.05, 0.1]   # its smaller batches skipped, say
    drawn(plot_latency(tmp_path / "latency.png", result, 64, log=True))
    out = capsys.readouterr().out
    assert "linear-recurrent at batch 16" in out and "softmax-kv-cache at batch 256" in out


def test_latency_plot_without_step_samplers_says_why(tmp_path, capsys):
    assert plot_latency(tmp_path / "latency.png", fake_sweep([1, 4], methods=("softmax-recompute",)), 64) is None
    assert "no latency plot: no step sampler" in capsys.readouterr().out
    assert not (tmp_path / "latency.png").exists()


def write_run(folder, rows, lines=()):
    folder.mkdir(parents=True)
    with open(folder / "metrics.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.writelines(lines)
    return folder


def train_rows(steps, start_bpd, seconds_per_step):
    return [{"step": s, "loss": start_bpd / s ** 0.3 * 0.69, "bpd": start_bpd / s ** 0.3, "lr": 1e-3,
             "tokens_per_s": 1000.0, "elapsed": s * seconds_per_step} for s in steps]


def test_curve_skips_rows_without_the_key_and_keeps_the_last_row_of_a_step():
    rows = train_rows([10, 20, 30], 8, 6) + [{"step": 30, "val_bpd": 3.0}, {"event": "resume", "step": 20},
                                             {"step": 30, "bpd": 2.5, "elapsed": 200.0}]
    assert plots.curve(rows, "bpd") == ([10, 20, 30], [rows[0]["bpd"], rows[1]["bpd"], 2.5], [1.0, 2.0, 200 / 60])
    # validation rows carry no clock: their minutes come from the training rows at that step
    rows.append({"step": 25, "val_bpd": 3.5})
    steps, values, minutes = plots.curve(rows, "val_bpd")
    assert (steps, values) == ([25, 30], [3.5, 3.0])
    assert minutes == pytest.approx([(120 + 200) / 2 / 60, 200 / 60])   # halfway from step 20 to 30
    assert plots.curve([{"step": 1, "val_bpd": 2.0}], "val_bpd") == ([1], [2.0], None)


def test_training_curves_of_two_runs(tmp_path, capsys):
    a = write_run(tmp_path / "linear", train_rows(range(10, 210, 10), 8, 0.5)
                  + [{"step": s, "val_bpd": 8 / s ** 0.3 + 0.1} for s in (50, 100, 150, 200)],
                  lines=['{"step": 210, "loss": 1.'])                 # cut short by a crash: dropped
    b = write_run(tmp_path / "softmax", train_rows(range(10, 110, 10), 7, 2.0)
                  + [{"event": "resume", "step": 50}, {"step": 100, "val_bpd": 2.0}])
    out = plots.training_curves([a, b], tmp_path / "curves.png")
    drawn(out)
    printed = capsys.readouterr().out
    assert "linear: train" in printed and "at step 200" in printed and "softmax: train" in printed
    assert plots.default_out([a, b]) == tmp_path.resolve() / "curves.png"
    assert plots.default_out([a]) == a.resolve() / "curves.png"


def test_training_curves_errors_are_one_sentence(tmp_path):
    for folder, text in (("missing", None), ("empty", ""), ("events", '{"event": "resume", "step": 3}\n'),
                         ("garbage", 'not json\n{"step": 1, "bpd": 2}\n')):
        if text is not None:
            (tmp_path / folder).mkdir()
            (tmp_path / folder / "metrics.jsonl").write_text(text)
        with pytest.raises(UserError) as e:
            plots.training_curves([tmp_path / folder], tmp_path / "x.png")
        assert "\n" not in str(e.value) and folder in str(e.value)
    with pytest.raises(UserError, match="no runs"):
        plots.training_curves([], tmp_path / "x.png")


def test_training_curves_keep_a_file_imagegen_did_not_write(tmp_path):
    a = write_run(tmp_path / "a", train_rows(range(1, 30), 8, 1.0) + [{"step": 29, "val_bpd": 3.0}])
    essay = tmp_path / "essay.png"
    essay.write_text("mine")
    with pytest.raises(UserError, match="overwrite=true") as e:
        plots.training_curves([a], essay)
    assert essay.read_text() == "mine" and "\n" not in str(e.value)
    assert Image.open(plots.training_curves([a], essay, overwrite=True)).format == "PNG"
    essay.write_bytes(b"")                                          # changed since: refused again
    with pytest.raises(UserError, match="overwrite=true"):
        plots.training_curves([a], essay)
    plots.training_curves([a], essay, overwrite=True)
    assert Image.open(plots.training_curves([a], essay)).format == "PNG"   # ours, unchanged: replaced
    svg = plots.training_curves([a], tmp_path / "curves.svg")
    assert svg.read_text().lstrip().startswith("<?xml")                 # the format the suffix names
    with pytest.raises(UserError, match="names no format matplotlib writes"):
        plots.training_curves([a], tmp_path / "curves.txt")
    assert not (tmp_path / "curves.txt").exists()


def run_module(module, *args):
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.slow
def test_plot_command(tmp_path):
    a = write_run(tmp_path / "a", train_rows(range(1, 30), 8, 1.0) + [{"step": 29, "val_bpd": 3.0}])
    b = write_run(tmp_path / "b", train_rows(range(1, 20), 6, 3.0))
    proc = run_module("imagegen.commands.plot", f"runs=[{a},{b}]", "log=true")
    assert proc.returncode == 0, proc.stderr
    drawn(tmp_path / "curves.png")
    assert f"wrote {tmp_path.resolve() / 'curves.png'}" in proc.stdout
    proc = run_module("imagegen.commands.plot", f"runs={tmp_path / 'nothing'}", f"out={tmp_path / 'x.png'}")
    err = proc.stderr.strip()
    assert proc.returncode != 0 and len(err.splitlines()) == 1 and "no metrics in" in err, err


@pytest.mark.slow
def test_sampling_bench_writes_latency_plot_without_plot_batch_in_sweep(tmp_path):
    proc = run_module("imagegen.commands.bench", "mode=sampling", "preset=small", *TINY,
                      "sampling.methods=[linear-recurrent]", "sampling.step_batches=[1,2]", "sampling.n_positions=2",
                      "sampling.probe_positions=[]", "sampling.reps=1", "threads=1", f"out_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "plot_batch 64 was not measured" in proc.stdout and "linear-recurrent at batch 2" in proc.stdout
    img = np.asarray(Image.open(tmp_path / "sampling-mnist-small-latency.png").convert("RGB")).astype(int)
    assert (np.abs(img - (31, 119, 180)).sum(axis=2) < 30).sum() > 50
