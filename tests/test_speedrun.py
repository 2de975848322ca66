"""The speedrun's pieces: Muon beside AdamW as one optimizer (exact resume), per-group schedules, zero-init,
the validation target, the precision a run keeps, and imagegen-bench mode=speedrun's record."""
import json
import math
from dataclasses import replace

import pytest
import torch

from commands import TRAIN, call, one_line_error, run
from fixtures import assert_same_training, tiny_model
from imagegen.benchmarks import speedrun
from imagegen.config import TrainOptions
from imagegen.training.optim import Muon, MuonAdamW, is_hidden_matrix, make_optimizer
from imagegen.training.trainer import lr_factor, zero_output_projections

MUON = TrainOptions(optimizer="muon", lr=1e-2, betas=[0.9, 0.98], weight_decay=0.0)


def loss_of(model, seed):
    x = torch.randint(0, 256, (3, model.length), generator=torch.Generator().manual_seed(seed))
    return -model.head.log_prob(model(x), x).mean()


def train_steps(model, opt, seeds):
    for seed in seeds:
        opt.zero_grad(set_to_none=True)
        loss_of(model, seed).backward()
        opt.step()


def test_muon_trains_the_blocks_matrices_and_adamw_the_rest():
    model = tiny_model(n_layers=2)
    opt = make_optimizer(model, MUON)
    muon, adamw = opt.parts
    assert isinstance(opt, MuonAdamW) and isinstance(muon, torch.optim.Muon)
    hidden = {id(p) for g in muon.param_groups for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in hidden}
    assert names == {n for n, p in model.named_parameters() if n.startswith("blocks.") and p.ndim == 2}
    assert any(n.endswith("ff.0.weight") for n in names) and not any(n.startswith("tok.") for n in names)
    assert len(hidden) + sum(len(g["params"]) for g in adamw.param_groups) == len(list(model.parameters()))
    assert not is_hidden_matrix("tok.weight", model.tok.weight)


def test_muon_state_dict_round_trip_continues_exactly():
    """Three steps, the optimizer's state_dict into a fresh model and optimizer, three more: bit-identical to
    six steps without the stop (weights and every moment)."""
    ref = tiny_model(n_layers=2, seed=1)
    opt = make_optimizer(ref, MUON)
    train_steps(ref, opt, range(6))

    cut = tiny_model(n_layers=2, seed=1)
    first = make_optimizer(cut, MUON)
    train_steps(cut, first, range(3))
    saved, weights = first.state_dict(), {k: v.clone() for k, v in cut.state_dict().items()}
    ids = [i for g in saved["param_groups"] for i in g["params"]]
    assert ids == list(range(len(list(cut.parameters()))))          # one numbering across both parts
    again = tiny_model(n_layers=2, seed=99)
    again.load_state_dict(weights)
    second = make_optimizer(again, MUON)
    second.load_state_dict(saved)
    train_steps(again, second, range(3, 6))
    for (name, a), b in zip(ref.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    for i, s in opt.state_dict()["state"].items():
        for key, value in s.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(second.state_dict()["state"][i][key])), (i, key)


def test_each_group_follows_the_schedule_from_its_own_peak():
    t = TrainOptions(warmup_steps=10, max_steps=110, max_minutes=None, min_lr_ratio=0.1)
    assert lr_factor(t, 0, 0) == pytest.approx(0.1) and lr_factor(t, 9, 0) == pytest.approx(1.0)
    assert lr_factor(t, 60, 0) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(t, 110, 0) == pytest.approx(0.1)
    assert lr_factor(replace(t, max_minutes=1.0), 10, 30.0) == pytest.approx(0.55)      # the time budget binds
    linear = replace(t, decay="linear")
    assert lr_factor(linear, 9, 0) == pytest.approx(1.0) and lr_factor(linear, 35, 0) == pytest.approx(0.1 + 0.9 * 0.75)
    assert lr_factor(linear, 110, 0) == pytest.approx(0.1) and lr_factor(linear, 500, 0) == pytest.approx(0.1)
    model = tiny_model()
    opt = make_optimizer(model, replace(MUON, muon_lr=0.05))
    assert [g["lr"] for g in opt.param_groups] == [0.05, 1e-2]


def test_zero_init_makes_every_block_the_identity_and_the_output_uniform():
    model = tiny_model(n_layers=2)
    zero_output_projections(model)
    x = torch.randint(0, 256, (2, model.length))
    logp = model.head.log_prob(model(x), x)
    assert torch.allclose(logp, torch.full_like(logp, -math.log(256)))
    assert all(b.ff[0].weight.abs().sum() > 0 for b in model.blocks)      # the inner matrices stay random


def test_time_to_target_reads_the_first_validation_under_it():
    rows = [{"step": 10, "loss": 1.0}, {"step": 50, "val_bpd": 1.2, "elapsed": 30.0, "wall": 31.0},
            {"step": 100, "val_bpd": 0.99, "elapsed": 61.0, "wall": 63.0},
            {"step": 150, "val_bpd": 0.95, "elapsed": 90.0, "wall": 95.0}]
    assert speedrun.time_to_target(rows, 1.0) == (100, 61.0, 63.0, 0.95)
    assert speedrun.time_to_target(rows, 0.5) == (None, None, None, 0.95)


def test_the_record_table_compares_each_run_with_the_record_before_it():
    base = {"data": "mnist", "target": 1.0, "threads": 1, "cpu": "X", "date": "d", "load": ""}
    record = {"peaks": {"X": {"float32": 100.0, "bfloat16": 200.0}}, "rows": [
        {**base, "change": "baseline", "cpu_seconds": 600.0, "kept": True, "useful_gflops": 50.0},
        {**base, "change": "worse", "cpu_seconds": 900.0, "kept": False},
        {**base, "change": "better", "cpu_seconds": 120.0, "kept": True},
        {**base, "change": "next", "cpu_seconds": None, "kept": None},
        {**base, "change": "elsewhere", "cpu": "Y", "cpu_seconds": 60.0, "kept": True}]}
    lines = speedrun.table(record).splitlines()
    rows = {line.split(" | ")[1]: line for line in lines if line.startswith("| mnist")}
    assert "| 10.00 | - |" in rows["baseline"] and "| 50 | 25 |" in rows["baseline"]
    assert "| 15.00 | 10.00 |" in rows["worse"] and "dropped" in rows["worse"]
    assert "| 2.00 | 10.00 |" in rows["better"] and "kept" in rows["better"]
    assert "| - | 2.00 |" in rows["next"] and "pending" in rows["next"]
    assert "| 1.00 | - |" in rows["elsewhere"]                   # another CPU's record is not this one's
    assert "X: float32 100, bfloat16 200 GFLOP/s" in lines[2]
    record["peaks"]["X"]["bfloat16"] = 5.0                       # emulated: no share of it
    assert "| 50 | - |" in speedrun.table(record)


def test_useful_flops_count_six_per_parameter_and_the_linear_state():
    model = tiny_model(n_layers=2, d_model=16, n_heads=2, d_ff=32)
    body = sum(p.numel() for n, p in model.named_parameters() if not n.startswith(("tok.", "row.", "col.", "chan.")))
    assert speedrun.useful_flops_per_token(model) == 6 * body + 2 * 12 * 2 * 8 * 8
    softmax = tiny_model(attention="softmax", n_layers=2, d_model=16, n_heads=2, d_ff=32)
    assert speedrun.useful_flops_per_token(softmax) == 6 * body


@pytest.mark.slow
def test_imagegen_train_stops_at_the_target_and_resumes_muon_exactly(mnist_root, tmp_path):
    """optimizer=muon with zero_init, stopped at step 4 and resumed to 8: the same weights and moments as
    8 steps at once (a constant learning rate after warmup, so that the two budgets' schedules agree);
    train.target_bpd stops a run at its first validation under the target."""
    muon = [*TRAIN, f"data.root={mnist_root}", "train.optimizer=muon", "train.zero_init=true",
            "model.context=[2,5]", "train.val_every=100", "train.min_lr_ratio=1.0"]
    run("imagegen-train", *muon, f"run_dir={tmp_path / 'ref'}", "train.max_steps=8")
    run("imagegen-train", *muon, f"run_dir={tmp_path / 'cut'}", "train.max_steps=4")
    run("imagegen-train", *muon, f"run_dir={tmp_path / 'cut'}", "train.max_steps=8")
    assert_same_training(tmp_path / "ref", tmp_path / "cut")
    a = torch.load(tmp_path / "ref" / "last.pt", weights_only=True)
    assert a["state"]["step"] == 8
    assert any("momentum_buffer" in s for s in a["optimizer"]["state"].values())      # Muon's state resumed too

    proc = run("imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={tmp_path / 'tgt'}",
               "train.max_steps=50", "train.val_every=2", "train.target_bpd=100")
    assert "validation reached train.target_bpd=100" in proc.stdout
    rows = [json.loads(line) for line in (tmp_path / "tgt" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "target_reached" in r] == [2]
    assert torch.load(tmp_path / "tgt" / "last.pt", weights_only=True)["state"]["step"] == 2
    again = run("imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={tmp_path / 'tgt'}",
                "train.max_steps=50", "train.val_every=2", "train.target_bpd=100")
    assert "already reached train.target_bpd=100" in again.stdout


@pytest.mark.slow
def test_a_resume_keeps_the_runs_optimizer_and_precision(mnist_root, tmp_path, monkeypatch):
    """A resume with another optimizer, or another explicit precision, is refused in one sentence;
    train.bf16=auto trains on in the precision the checkpoint was trained in, whatever auto would pick."""
    args = [*TRAIN, f"data.root={mnist_root}", f"run_dir={tmp_path}"]
    run("imagegen-train", *args, "train.bf16=true", "train.max_steps=2")
    assert torch.load(tmp_path / "last.pt", weights_only=True)["precision"] == "bfloat16"
    one_line_error(call("imagegen-train", *args, "train.max_steps=4", "train.optimizer=muon"),
                   "holds adamw optimizer state but train.optimizer=muon")
    one_line_error(call("imagegen-train", *args, "train.bf16=false", "train.max_steps=4"),
                   "was trained in bfloat16, but train.bf16=false asks for float32")
    monkeypatch.setattr("imagegen.precision.auto_bf16", lambda device, dims=None: (False, "stubbed: float32"))
    proc = call("imagegen-train", *args, "train.bf16=auto", "train.max_steps=3")
    assert proc.returncode == 0 and "training on in bfloat16" in proc.stdout, (proc.stdout, proc.stderr)
    ck = torch.load(tmp_path / "last.pt", weights_only=True)
    assert ck["precision"] == "bfloat16" and ck["state"]["step"] == 3


@pytest.mark.slow
def test_bench_speedrun_records_a_run_and_reads_it_again(mnist_root, tmp_path):
    record = tmp_path / "speedrun.json"
    args = ["mode=speedrun", f"out_dir={tmp_path}", "data=mnist", f"data.root={mnist_root}",
            f"speedrun.record={record}", "speedrun.change=tiny", "speedrun.budgets=[0.05,1]",
            "speedrun.target=100", "speedrun.val_every=2", "speedrun.val_images=4", "speedrun.test_images=4",
            "speedrun.overrides=['model.n_layers=1','model.d_model=16','model.n_heads=2','model.d_ff=32',"
            "'train.batch_size=4','train.warmup_steps=2']"]
    first = run("imagegen-bench", *args)
    assert "tiny, budget 0.05 min: reached 100" in first.stdout
    rows = json.loads(record.read_text())["rows"]
    assert len(rows) == 1 and rows[0]["reached"] and rows[0]["steps"] == 2 and rows[0]["budget_minutes"] == 0.05
    assert rows[0]["test_bpd"] > 0 and rows[0]["useful_gflops"] > 0 and rows[0]["kept"] is None
    assert "| mnist | tiny | 0.05 |" in record.with_suffix(".md").read_text()
    second = run("imagegen-bench", *args)                      # the finished run is read, not trained again
    assert "nothing to do" in (tmp_path / "speedrun-runs" / "mnist-tiny-0.05m-s0.log").read_text()
    assert len(json.loads(record.read_text())["rows"]) == 1 and "reached 100" in second.stdout


def test_muon_in_bfloat16_is_torchs_and_in_float32_near_float64():
    """Our Muon with bfloat16 orthogonalisation takes torch.optim.Muon's steps bit for bit; in float32 its
    steps stay within float32's reach of the same update computed in float64."""
    def steps(make, dtype=torch.float32, n=3):
        model = tiny_model(n_layers=2, seed=3).to(dtype)
        hidden = [p for name, p in model.named_parameters() if is_hidden_matrix(name, p)]
        opt = make(hidden)
        for seed in range(n):
            opt.zero_grad(set_to_none=True)
            loss_of(model, seed).backward()
            opt.step()
        return [p.detach().double() for p in hidden]

    kw = dict(lr=0.05, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
    theirs = steps(lambda ps: torch.optim.Muon(ps, **kw))
    ours = steps(lambda ps: Muon(ps, dtype=torch.bfloat16, **kw))
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours))
    exact = steps(lambda ps: Muon(ps, dtype=torch.float64, **kw), dtype=torch.float64)
    fp32 = steps(lambda ps: Muon(ps, dtype=torch.float32, **kw))
    for a, b, t in zip(fp32, exact, theirs):
        assert (a - b).abs().max() < 1e-4 < (t - b).abs().max()        # bfloat16's is further off


@pytest.mark.parametrize("arg,pattern", [
    ("train.optimizer=lion", "train.optimizer must be adamw, adam, radam or muon"),
    ("train.decay=step", "train.decay must be cosine or linear"),
    ("train.muon_lr=nan", "train.muon_lr must be a finite number > 0"),
    ("train.muon_lr=-1", "train.muon_lr must be a positive number"),
    ("train.muon_momentum=1.0", "train.muon_momentum must lie in [0, 1)"),
    ("train.target_bpd=inf", "train.target_bpd must be a finite number > 0"),
    ("train.target_bpd=0", "train.target_bpd must be a positive number"),
])
def test_the_speedrun_options_are_checked_in_one_sentence(mnist_root, tmp_path, arg, pattern):
    one_line_error(call("imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={tmp_path}", arg), pattern)
    assert not (tmp_path / "last.pt").exists()


def test_runs_finishing_at_once_all_stay_in_the_record(tmp_path):
    """Four processes add their rows at the same moment: the record holds all four (each rewrites it in the
    folder's turn) and its table is written from the whole record."""
    import subprocess
    import sys
    record = tmp_path / "speedrun.json"
    code = ("import sys, pathlib; from imagegen.benchmarks import speedrun; i = sys.argv[1]; "
            "row = {'data': 'mnist', 'target': 1.0, 'threads': 1, 'cpu': 'X', 'date': 'd', 'load': '', "
            "'change': 'c' + i, 'cpu_seconds': 60.0, 'kept': None, 'run_dir': 'r' + i}; "
            "[speedrun.add_row(pathlib.Path(sys.argv[2]), {**row, 'run_dir': f'r{i}-{k}'}) for k in range(5)]")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i), str(record)]) for i in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    rows = json.loads(record.read_text())["rows"]
    assert sorted(r["run_dir"] for r in rows) == sorted(f"r{i}-{k}" for i in range(4) for k in range(5))
    assert record.with_suffix(".md").read_text().count("| mnist |") == 20
