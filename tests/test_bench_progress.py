"""Benchmarks as a user meets them: the plan printed first, rows written as they come (a stopped run
keeps what it measured), and quick=true's settings."""
import json

import pytest
import torch

from imagegen.benchmarks import attention, progress
from imagegen.config import BenchConfig, typed

CPU = torch.device("cpu")
ATTENTION = {"mode": "attention", "quick": True, "attention": {
    "batch": 1, "heads": 2, "head_dim": 4, "impls": ["softmax", "chunked"], "dtypes": ["float32"], "lengths": [16, 32],
    "repeat": 1, "cumsum_max_gb": 1.0}}


def test_attention_rows_are_written_as_they_come_and_a_stopped_run_keeps_them(tmp_path, monkeypatch, capsys):
    real, calls = attention.time_case, []

    def stop_at_third(*args):
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args)
    monkeypatch.setattr(attention, "time_case", stop_at_third)
    with pytest.raises(KeyboardInterrupt):
        attention.run_attention(ATTENTION, CPU, out_dir=tmp_path)
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("plan (quick): 4 cases: float32 L=16 softmax, float32 L=16 chunked")
    assert "[2/4 " in out and "left]" in out
    saved = json.loads((tmp_path / "attention.json").read_text())
    assert saved["partial"] is True and [(r["L"], r["impl"]) for r in saved["rows"]] == [(16, "softmax"),
                                                                                        (16, "chunked")]
    assert "bwd_over_fwd" in saved["rows"][1] and "chunked" in (tmp_path / "attention.md").read_text()


def test_whole_attention_run(tmp_path):
    result, md = attention.run_attention(ATTENTION, CPU, out_dir=tmp_path)
    assert len(result["rows"]) == 4 and "peak memory not measured" in md
    assert len(json.loads((tmp_path / "attention.json").read_text())["rows"]) == 4


def test_quick_settings():
    c = {"mode": "train_step", "quick": True, "data": {"name": "cifar10"}, "attention": {"lengths": [8]},
         "train_step": {"batch": 16, "repeat": 3, "precisions": ["float32", "auto"],
                        "lengths": {"mnist": 784, "cifar10": 3072}},
         "sampling": {"step_batches": [4], "max_cache_gb": 1.0}}
    q = progress.apply_quick(c).train_step
    assert (q.batch, q.repeat, q.precisions, q.lengths) == (2, 1, ["float32"], {"cifar10": 3072})
    assert c["train_step"]["batch"] == 16                                   # the config itself is left alone
    typed_c = typed(BenchConfig, c)
    assert progress.apply_quick(typed_c).train_step.batch == 2 and typed_c.train_step.batch == 16
    assert progress.apply_quick({**c, "quick": False}) == typed(BenchConfig, {**c, "quick": False})
    assert progress.apply_quick({**c, "mode": "attention"}).attention.lengths == [784, 3072]
    quick = progress.apply_quick({**c, "mode": "sampling"}).sampling
    assert quick.step_batches == [1, 16] and quick.max_cache_gb == 1.0      # merged into the section


def test_sampling_rows_are_written_as_they_come_and_a_stopped_run_keeps_them(tmp_path, monkeypatch, capsys):
    from imagegen.benchmarks import sampling
    from imagegen.data.sets import dataset_info
    cfg = {"seed": 0, "arch_name": "tiny", "quick": True, "sampling": {
        "n_positions": 2, "probe_positions": [], "precisions": ["float32"], "reps": 1, "methods": ["linear-recurrent"],
        "step_batches": [1, 2, 3], "recompute_batches": [1], "max_cache_gb": 1.0, "lsh_options": {}}}
    model = {"attention": "linear", "attention_options": {}, "n_layers": 1, "d_model": 8, "n_heads": 2, "d_ff": 16,
             "head": "categorical", "n_mixtures": 2, "dropout": 0.0}
    monkeypatch.setattr(sampling, "whole_image_seconds", lambda *a, **k: 1.0)
    real, calls = sampling.latency, []

    def stop_at_batch_3(model_, sampler, batch, *args, **kw):
        calls.append(batch)
        if batch == 3:
            raise KeyboardInterrupt
        return real(model_, sampler, batch, *args, **kw)
    monkeypatch.setattr(sampling, "latency", stop_at_batch_3)
    with pytest.raises(KeyboardInterrupt):
        sampling.run(cfg, model, dataset_info("mnist"), out_dir=tmp_path, out_name="s")
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("plan (quick): 3 cases: linear-recurrent batch 1, linear-recurrent batch 2")
    assert "[2/3 " in out and "left]" in out
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["partial"] is True and [r["batch"] for r in saved["results"]] == [1, 2]
    assert all(r["limit_share"] > 0 for r in saved["results"])          # the RNN's share of its step limit
    assert "| linear-recurrent | float32 | 2 |" in (tmp_path / "s.md").read_text()
