"""The benchmarks count minor page faults per timed call beside the times (a regression in memory reuse
shows as faults, not only as time), and report time per position."""
import mmap

import torch

from imagegen.benchmarks import attention, sampling, timing
from imagegen.config import BenchConfig, ModelConfig, typed

PAGE = mmap.PAGESIZE


def fresh_pages(n):
    """A call that touches n pages the process never had: n minor faults."""
    def touch():
        with mmap.mmap(-1, n * PAGE) as m:
            for i in range(n):
                m[i * PAGE] = 1
    return touch


def test_time_all_counts_faults_per_call():
    faults = {}
    timing.time_all({"fresh": fresh_pages(256), "none": lambda: None}, torch.device("cpu"), 3, faults)
    assert 256 <= faults["fresh"] < 300 and faults["none"] < 8


def test_sampling_timed_counts_faults_per_call():
    faults = []
    sampling.timed(fresh_pages(128), 2, faults)
    sampling.timed(lambda: None, 2, faults)
    assert 128 <= faults[0] < 160 and faults[1] < 8


def test_attention_rows_have_time_per_position_and_faults():
    c = {"attention": {"batch": 2, "heads": 2, "head_dim": 4, "lengths": [8, 16], "impls": ["chunked"],
                       "dtypes": ["float32"], "repeat": 1, "cumsum_max_gb": 1.0}, "quick": True}
    result, md = attention.run_attention(c, torch.device("cpu"))
    for row in result["rows"]:
        assert row["fwd_us_per_position"] == row["fwd_ms"] * 1e3 / (2 * row["L"])
        assert row["fwd_bwd_us_per_position"] == row["fwd_bwd_ms"] * 1e3 / (2 * row["L"])
        assert row["fwd_faults"] >= 0 and row["fwd_bwd_faults"] >= 0
    assert "| page faults / fwd | page faults / fwd+bwd |" in md and "us / position" in md


def test_sampling_rows_have_time_per_position_and_faults(monkeypatch):
    from imagegen.data.sets import dataset_info
    cfg = {"seed": 0, "arch_name": "tiny", "sampling": {
        "n_positions": 2, "probe_positions": [], "precisions": ["float32"], "reps": 1, "methods": ["linear-recurrent"],
        "step_batches": [1], "recompute_batches": [1], "max_cache_gb": 1.0, "lsh_options": {}}}
    model = {"attention": "linear", "attention_options": {}, "n_layers": 1, "d_model": 8, "n_heads": 2, "d_ff": 16,
             "head": "categorical", "n_mixtures": 2, "dropout": 0.0}
    monkeypatch.setattr(sampling, "whole_image_seconds", lambda *a, **k: 1.0)
    result = sampling.run(cfg, model, dataset_info("mnist"))
    row = result["results"][0]
    assert row["ms_per_position"] == row["seconds_per_batch"] / 784 * 1e3 and row["faults_per_call"] >= 0
    md = sampling.report(result, typed(BenchConfig, cfg), "tiny", dataset_info("mnist"), typed(ModelConfig, model))
    assert "ms / position (batch) | page faults / step |" in md
