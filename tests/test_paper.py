"""imagegen-bench mode=paper: every attention trained alike, one process per core, then a table of
exact test bits/dim and sampling speed; a rerun of a finished comparison measures and changes nothing,
and a comparison stopped by SIGTERM halfway ends, once run again, with the rows of an uninterrupted one."""
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch
from commands import call, one_line_error, run
from fixtures import tiny_checkpoint, write_mnist
from omegaconf import OmegaConf

from imagegen import config
from imagegen.benchmarks import paper
from imagegen.benchmarks.progress import apply_quick
from imagegen.commands.cli import compose
from imagegen.config import BenchConfig
from imagegen.config.bench import PaperOptions
from imagegen.errors import UserError
from imagegen.training.runstate import RunState

ATTENTIONS = ["softmax", "linear", "lsh", "lsh4"]
FILES = ("paper-mnist.json", "paper-mnist.md", "paper-mnist.png")
PNG = b"\x89PNG\r\n\x1a\n"


def bench_args(out, mnist_root):
    return ["mode=paper", "quick=true", f"data.root={mnist_root}", "data.download=false", "threads=1",
            f"out_dir={out}"]


def rows_of(out):
    return json.loads((out / "paper-mnist.json").read_text())["rows"]


def snapshot(out):
    """Every file under out (contents and modification times)."""
    return {p.relative_to(out): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- the pieces, in this process
def composed(name, args):
    config.register()                            # the schemas in Hydra's ConfigStore, as a command does
    return OmegaConf.to_container(compose(name, args), resolve=True)


def bench_cfg(mnist_root, options=None, **kw):
    """The quick paper config (a BenchConfig), its paper section updated with options and the rest with kw."""
    cfg = apply_quick(composed("bench", ["mode=paper", "quick=true", f"data.root={mnist_root}", "data.download=false",
                                         "arch_name=paper_mnist"]))        # what the command resolves from preset=
    return replace(cfg, paper=replace(cfg.paper, **(options or {})), **kw)


def test_each_run_gets_the_same_architecture_seed_and_budget(mnist_root, tmp_path):
    c = bench_cfg(mnist_root, seed=3, train=replace(bench_cfg(mnist_root).train, betas=[0.8, 0.9], init=None))
    runs = {a: composed("train", paper.train_args(c, a, tmp_path / "runs" / f"mnist-{a}")) for a in ATTENTIONS}
    for attention, t in runs.items():
        assert {k: t["model"][k] for k in paper.ARCH_KEYS} == {k: getattr(c.model, k) for k in paper.ARCH_KEYS}
        assert t["seed"] == 3 and t["threads"] == 1 and t["train"]["progress"] is False
        assert (t["train"]["max_steps"], t["train"]["max_minutes"]) == (32, None)
        assert t["train"]["betas"] == [0.8, 0.9] and t["train"]["lr"] == c.train.lr
        assert t["data"]["root"] == str(mnist_root) and t["run_dir"].endswith(f"runs/mnist-{attention}")
    assert [runs[a]["model"]["attention"] for a in ATTENTIONS] == ["softmax", "linear", "lsh", "lsh"]
    assert runs["lsh4"]["model"]["attention_options"]["n_hashes"] == 4
    minutes = paper.train_args(replace(c, paper=replace(c.paper, budget="minutes", minutes=2.5)), "linear",
                               tmp_path / "r")
    t = composed("train", minutes)["train"]
    assert t["max_minutes"] == 2.5 and t["max_steps"] == paper.UNBOUNDED_STEPS


def test_never_more_processes_than_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert [paper.slots(BenchConfig(paper=PaperOptions(jobs=j))) for j in (0, 1, 2, 8)] == [2, 1, 2, 2]


@pytest.mark.parametrize("change, says", [({"attentions": ["linear", "rnn"]}, "unknown attention 'rnn'"),
                                          ({"attentions": []}, "each attention once"),
                                          ({"budget": "hours"}, "paper.budget must be minutes or steps"),
                                          ({"budget": "minutes", "minutes": 0}, "paper.minutes must be > 0")])
def test_bad_options_are_one_sentence(mnist_root, change, says):
    with pytest.raises(UserError, match=says):
        paper.check(bench_cfg(mnist_root, change))


def test_a_truncated_checkpoint_of_a_run_says_what_the_bench_can_do(mnist_root, tmp_path):
    """It said "use another checkpoint, e.g. best.pt", which mode=paper takes no option for."""
    run_dir = tmp_path / "runs" / "mnist-linear"
    run_dir.mkdir(parents=True)
    (run_dir / "last.pt").write_bytes(b"PK\x03\x04 half a checkpoint")
    with pytest.raises(UserError) as e:
        paper.status(bench_cfg(mnist_root), "linear", run_dir)
    assert str(e.value).endswith(f"; remove the run folder {run_dir} and run the same command again to train that "
                                 f"row anew.") and "best.pt" not in str(e.value)


def test_hydra_values_round_trip():
    from hydra.core.override_parser.overrides_parser import OverridesParser
    parser = OverridesParser.create()
    for value in (None, True, 3, 1e-05, 0.001, "auto", "/a b/it's", [0.9, 0.98], {"n_hashes": 4}):
        parsed = parser.parse_override(f"x={paper.hydra_value(value)}").value()
        assert parsed == value, (value, parsed)


# ---------------------------------------------------------------- the command, end to end
@pytest.fixture(scope="module")
def finished(mnist_root, tmp_path_factory):
    """A whole quick comparison, uninterrupted: (out_dir, seconds it took)."""
    out = tmp_path_factory.mktemp("paper")
    start = time.perf_counter()
    run("imagegen-bench", *bench_args(out, mnist_root), timeout=600)
    return out, time.perf_counter() - start


@pytest.mark.slow
def test_paper_writes_one_row_per_attention(finished):
    out, _ = finished
    payload = json.loads((out / "paper-mnist.json").read_text())
    rows = payload["rows"]
    assert [r["attention"] for r in rows] == ATTENTIONS
    for r in rows:
        assert {"data", "attention", "train_minutes", "steps", "test_bits_per_dim", "images_per_sec", "batch",
                "whole_image_seconds", "cpu"} <= set(r)
        assert r["data"] == "mnist" and r["steps"] == 32 and r["test_images"] == 16     # the fixture's test split
        assert 0 < r["test_bits_per_dim"] < 8.5 and math.isfinite(r["test_bits_per_dim"])
        assert r["images_per_sec"] > 0 and r["whole_image_seconds"] > 0 and 0 < r["train_minutes"] < 5
        assert r["cpu"]
    by = {r["attention"]: r for r in rows}
    assert (by["linear"]["sampler"], by["softmax"]["sampler"], by["lsh"]["sampler"]) == ("recurrent", "kv-cache",
                                                                                          "recompute")
    assert by["softmax"]["recompute_images_per_sec"] > 0 and "recompute_images_per_sec" not in by["linear"]
    assert by["linear"]["batch"] in (1, 8) and by["lsh"]["batch"] == 1
    # the same architecture and seed for every run, each with its own attention
    cks = {a: torch.load(out / "runs" / f"mnist-{a}" / "last.pt", weights_only=True) for a in ATTENTIONS}
    sizes = {a: {k: ck["config"]["model"][k] for k in paper.ARCH_KEYS} for a, ck in cks.items()}
    assert all(s == sizes["linear"] for s in sizes.values()) and {ck["config"]["seed"] for ck in cks.values()} == {0}
    assert cks["lsh4"]["config"]["model"]["attention_options"]["n_hashes"] == 4
    md = (out / "paper-mnist.md").read_text()
    assert sum(line.startswith(f"| {a} |") for a in ATTENTIONS for line in md.splitlines()) == 4
    assert (out / "paper-mnist.png").read_bytes().startswith(PNG)
    curves = payload["curves"]
    assert all(len(curves[a]["minutes"]) == len(curves[a]["val_bits_per_dim"]) == 4 for a in ATTENTIONS)


@pytest.mark.slow
def test_rerun_of_a_finished_comparison_changes_nothing(finished, mnist_root):
    out, took = finished
    before = snapshot(out)
    start = time.perf_counter()
    proc = run("imagegen-bench", *bench_args(out, mnist_root))
    seconds = time.perf_counter() - start
    assert "finished already: softmax, linear, lsh, lsh4" in proc.stdout and "training " not in proc.stdout
    after = snapshot(out)
    assert {p: b for p, (b, _) in after.items()} == {p: b for p, (b, _) in before.items()}
    # the runs and their kept rows untouched (the table's own files are rewritten with the same bytes)
    assert {p: m for p, (_, m) in after.items() if p.parts[0] == "runs"} == \
        {p: m for p, (_, m) in before.items() if p.parts[0] == "runs"}
    assert seconds < max(30.0, took / 2), (seconds, took)


@pytest.mark.slow
def test_stopped_halfway_and_run_again_gives_the_same_rows(finished, mnist_root, tmp_path):
    out = tmp_path / "stopped"
    first = out / "runs" / "mnist-softmax" / "last.pt"
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    exe = os.path.join(os.path.dirname(sys.executable), "imagegen-bench")
    proc = subprocess.Popen([exe, *bench_args(out, mnist_root)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert first.exists(), proc.communicate(timeout=60)[0]
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:                 # a test that failed leaves no bench behind
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and "interrupted" in output, output
    assert "SIGTERM: asking" in output and not (out / "paper-mnist.json").exists()
    steps = {}
    for a in ATTENTIONS:
        last = out / "runs" / f"mnist-{a}" / "last.pt"
        steps[a] = torch.load(last, weights_only=True)["state"]["step"] if last.exists() else None
    assert steps["softmax"] < 32, steps                      # stopped mid-run, saved
    assert "stopped by SIGTERM" in (out / "runs" / "mnist-softmax.log").read_text()
    assert not list(out.glob("runs/*/.*.tmp"))

    proc = run("imagegen-bench", *bench_args(out, mnist_root))
    assert "resuming: softmax" in proc.stdout
    key = [(r["attention"], r["steps"], r["test_bits_per_dim"]) for r in rows_of(out)]
    assert key == [(r["attention"], r["steps"], r["test_bits_per_dim"]) for r in rows_of(finished[0])]


@pytest.mark.slow
def test_a_run_that_fails_is_named_with_its_log_once(tmp_path):
    """Two runs failing alike: the end of the log shown once; no run kept, none claimed; no run dir left."""
    write_mnist(tmp_path / "few", n_train=3)             # fewer training images than the quick batch of 4
    out = tmp_path / "out"
    proc = run("imagegen-bench", *bench_args(out, tmp_path / "few"), "paper.attentions=[linear,softmax]",
               "paper.jobs=1", check=False)
    assert proc.returncode != 0 and proc.stdout.count("fewer than train.batch_size=4") == 1, proc.stdout
    assert "training mnist-softmax failed (exit status 1); its log ends as mnist-linear's did" in proc.stdout
    one_line_error(proc, "error: training failed for mnist-linear, mnist-softmax (their logs are in")
    assert "kept" not in proc.stderr and "1 at a time" in proc.stdout and not (out / "paper-mnist.json").exists()
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["mnist-linear.log", "mnist-softmax.log"]


def test_missing_data_is_said_once_before_any_run_starts(tmp_path):
    proc = call("imagegen-bench", *bench_args(tmp_path / "out", tmp_path / "no-data"))
    one_line_error(proc, "MNIST not found")
    assert "training " not in proc.stdout and not (tmp_path / "out" / "runs").exists()


def test_a_failed_sweep_names_the_runs_it_keeps(mnist_root, tmp_path, monkeypatch):
    c = bench_cfg(mnist_root, {"attentions": ["softmax", "linear", "lsh"]}, out_dir=str(tmp_path))
    (tmp_path / "runs" / "mnist-linear").mkdir(parents=True)
    (tmp_path / "runs" / "mnist-linear" / "last.pt").write_bytes(b"a run stopped halfway")
    monkeypatch.setattr(paper, "status", lambda c, a, d: ("new", None))
    monkeypatch.setattr(paper, "sweep", lambda jobs, n: ["mnist-softmax"])
    with pytest.raises(UserError, match=r"run the same command again \(linear kept: they resume or are reused\)\.$"):
        paper.run(c, evaluate=None)
    monkeypatch.setattr(paper, "sweep", lambda jobs, n: ["mnist-softmax", "mnist-linear", "mnist-lsh"])
    with pytest.raises(UserError, match=r"run the same command again\.$"):
        paper.run(c, evaluate=None)


# ---------------------------------------------------------------- runs that are not what they claim (issue 45)
def run_checkpoint(path, c, attention, options=None, data="mnist", step=32):
    """A checkpoint of c's quick architecture with `attention` (model.attention) and its options, as a run
    of `data` that stopped at `step`."""
    from imagegen.data.sets import dataset_info
    from imagegen.model.transformer import build_model
    model = {**{k: getattr(c.model, k) for k in paper.ARCH_KEYS}, "dropout": 0.0, "attention": attention,
             "attention_options": options or {}}
    cfg = {"model": model, "train": {"batch_size": 4},
           "data": {"name": data, "root": "/nonexistent", "download": False, "val_fraction": 0.05, "split_seed": 0}}
    state = {"step": step, "elapsed": 1.0, "epoch": 1, "seen": step * 4, "best_val": 1.0}
    path.parent.mkdir(parents=True, exist_ok=True)
    return tiny_checkpoint(path, config=cfg, state=state,
                           model=lambda p: build_model(model, dataset_info(data)).state_dict())


OWN = {"linear": ("linear", {}), "softmax": ("softmax", {}), "lsh": ("lsh", {}), "lsh4": ("lsh", {"n_hashes": 4})}


@pytest.mark.parametrize("attention, have, says", [
    ("linear", ("softmax", {}), "model.attention: 'softmax' in checkpoint vs 'linear' now"),
    ("lsh4", ("lsh", {}), "model.attention_options"),
    ("lsh", ("lsh", {"n_hashes": 4}), "model.attention_options"),
    ("linear", ("linear", {"gate": "head"}), "model.attention_options"),
])
def test_a_run_copied_in_from_another_attention_is_refused(mnist_root, tmp_path, attention, have, says):
    c = bench_cfg(mnist_root)
    run_dir = tmp_path / "runs" / f"mnist-{attention}"
    own = run_checkpoint(run_dir / "last.pt", c, *OWN[attention])
    assert paper.status(c, attention, run_dir)[0] == "finished"                      # its own: a finished run
    run_checkpoint(run_dir / "best.pt", c, *have)                                     # only best.pt copied in
    with pytest.raises(UserError, match=f"best.pt is not a {attention} run of this comparison"):
        paper.table_row(c, attention, run_dir, None, evaluate=None)
    run_checkpoint(run_dir / "last.pt", c, *have)                                     # both copied in
    with pytest.raises(UserError, match=f"last.pt is not a {attention} run of this comparison .*{says}.* move its "
                                        f"run folder .*mnist-{attention} away"):
        paper.status(c, attention, run_dir)
    assert own.exists()                                                               # refused, nothing removed


def test_a_run_of_other_data_is_refused(mnist_root, tmp_path):
    c = bench_cfg(mnist_root)
    run_checkpoint(tmp_path / "last.pt", c, "linear", data="fashion_mnist")
    with pytest.raises(UserError, match="data: fashion_mnist in checkpoint vs mnist now"):
        paper.status(c, "linear", tmp_path)


def test_an_unreadable_kept_row_is_measured_again(mnist_root, tmp_path, capsys, monkeypatch):
    c = bench_cfg(mnist_root)
    run_checkpoint(tmp_path / "best.pt", c, "linear")
    scored = []
    monkeypatch.setattr(paper, "measure_speed", lambda model, c, info: {"sampler": "recurrent", "batch": 1,
                                                                         "images_per_sec": 2.0,
                                                                         "whole_image_seconds": 0.5})

    def evaluate(path):
        scored.append(path)
        return {"bits_per_dim": 1.5, "images": 16}
    state = RunState(step=32, elapsed=60.0)
    row = paper.table_row(c, "linear", tmp_path, state, evaluate)
    assert paper.table_row(c, "linear", tmp_path, state, evaluate) == row and len(scored) == 1   # kept, reused
    kept = tmp_path / "paper-row.json"
    key = json.loads(kept.read_text())["measured_with"]
    for junk in (os.urandom(64) + b"\xff\xfe", b"[1, 2]", json.dumps({"measured_with": key, "row": {}}).encode()):
        kept.write_bytes(junk)
        capsys.readouterr()
        assert paper.table_row(c, "linear", tmp_path, state, evaluate)["test_bits_per_dim"] == 1.5
        assert f"linear: {kept} is unreadable" in capsys.readouterr().out
    assert len(scored) == 4 and json.loads(kept.read_text())["row"]["attention"] == "linear"


def test_paper_tables_refuse_an_unreadable_json_in_one_sentence(tmp_path):
    from imagegen.benchmarks import paper_tables
    paper_run(tmp_path / "m", "mnist", {"softmax": (2.0, 0.5), "linear": (20.0, None)})
    (tmp_path / "m" / "paper-mnist.json").write_bytes(os.urandom(32) + b"\xff")
    with pytest.raises(UserError, match="paper-mnist.json .* is unreadable or not what `imagegen-bench mode=paper` "
                                        "writes"):
        paper_tables.main([str(tmp_path / "m"), "--to", str(tmp_path / "x")])


# ---------------------------------------------------------------- Ctrl-C while it starts (issue 45)
# The console script's own two lines, after a line that says the interpreter is up (site imported)
SCRIPT = """
import sys
print("up", flush=True)
from imagegen.commands.scripts import bench
sys.argv = ["imagegen-bench", *sys.argv[1:]]
sys.exit(bench())
"""


@pytest.mark.slow
@pytest.mark.parametrize("after", [0.3, 1.0, 2.5])   # not 0: Python's own import of imagegen.commands.scripts,
# before its first line runs, is out of our reach (a SIGINT there shows the interpreter's traceback; under
# load that window reached this test at 0 s)
def test_ctrl_c_while_starting_is_one_line_and_exit_130(mnist_root, tmp_path, after):
    """SIGINT at some point of the start-up (imports of imagegen, Hydra, torch; the configs; the data
    check; the first runs): `interrupted`, exit status 130, nothing left half-written."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, *bench_args(out, mnist_root)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "HYDRA_FULL_ERROR": "0"})
    try:
        assert proc.stdout.readline() == "up\n"
        time.sleep(after)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and err.strip() == "interrupted", (proc.returncode, err)
    assert not list(out.rglob("*.tmp")) and not list(out.rglob(".*.tmp")) and not (out / "paper-mnist.json").exists()
    assert not [d for d in out.glob("runs/*") if d.is_dir() and [p.name for p in d.iterdir()] == [".lock"]]


def paper_run(out_dir, data, speeds):
    """A finished mode=paper out_dir with made-up rows: {attention: (images/sec, recompute images/sec)}."""
    out_dir.mkdir()
    rows = [{"data": data, "attention": a, "test_bits_per_dim": 1.0 + i / 10, "images_per_sec": s,
             "recompute_images_per_sec": r, "whole_image_seconds": 1.0 / s}
            for i, (a, (s, r)) in enumerate(speeds.items())]
    (out_dir / f"paper-{data}.json").write_text(json.dumps({"rows": rows}))
    (out_dir / f"paper-{data}.md").write_text(f"table of {data}\n")
    (out_dir / f"paper-{data}.png").write_bytes(b"png of " + data.encode())


def test_paper_tables_put_runs_side_by_side_with_linear_over_softmax(tmp_path, capsys):
    from imagegen.benchmarks import paper_tables
    paper_run(tmp_path / "m", "mnist", {"softmax": (2.0, 0.5), "linear": (20.0, None), "lsh": (0.1, None)})
    paper_run(tmp_path / "c", "cifar10", {"softmax": (1.0, 0.01), "linear": (30.0, None)})
    paper_tables.main([str(tmp_path / "m"), str(tmp_path / "c"), "--to", str(tmp_path / "docs" / "tables")])
    rows = json.loads((tmp_path / "docs" / "tables.json").read_text())
    assert [(r["data"], r["attention"]) for r in rows] == [("mnist", "softmax"), ("mnist", "linear"), ("mnist", "lsh"),
                                                           ("cifar10", "softmax"), ("cifar10", "linear")]
    md = (tmp_path / "docs" / "tables.md").read_text()
    assert "| mnist | 10x | 40x | 10x | +0.1000 |" in md and "| cifar10 | 30x | 3000x | 30x | +0.1000 |" in md
    assert "table of mnist" in md and "(tables-cifar10.png)" in md
    assert (tmp_path / "docs" / "tables-mnist.png").read_bytes() == b"png of mnist"
    with pytest.raises(UserError, match="holds 0 paper-<data>.json files"):
        paper_tables.main([str(tmp_path / "docs" / "nothing"), "--to", str(tmp_path / "x")])
