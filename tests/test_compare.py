"""imagegen-bench mode=compare puts bits/dim over the same images side by side, and reuses an
evaluation JSON only when it was written for the same checkpoint, split and image count."""
import json
import os

import pytest
import torch
from fixtures import write_mnist

from imagegen.store import checkpoint
from imagegen.benchmarks import compare
from imagegen.data.sets import dataset_info
from imagegen.errors import UserError
from imagegen.commands.evaluate import evaluate
from imagegen.model.transformer import build_model

MODEL = {"attention": "linear", "attention_options": {"impl": "auto"}, "n_layers": 1, "d_model": 16, "n_heads": 2,
         "d_ff": 32, "head": "categorical", "n_mixtures": 2, "dropout": 0.0}


def write_checkpoint(path, data_root, seed):
    torch.manual_seed(seed)
    model = build_model(MODEL, dataset_info("mnist"))
    data = {"name": "mnist", "root": str(data_root), "download": False, "val_fraction": 0.05, "split_seed": 0}
    checkpoint.save(path, {"config": {"model": MODEL, "data": data}, "model": model.state_dict(),
                           "state": {"step": 7}})
    return path


def bench_cfg(paths, max_images=None):
    return {"compare": {"checkpoints": [str(p) for p in paths], "split": "test"}, "max_images": max_images,
            "sampling": {"n_positions": 2, "reps": 1, "step_batches": [1], "recompute_batches": [1]}}


def evaluator(calls, max_images=None):
    def run(path):
        calls.append(path.name)
        return evaluate({"checkpoint": str(path), "split": "test", "batch_size": 8, "max_images": max_images,
                         "lsh_draws": 1, "lsh_seed": 0, "progress": False, "data": {"root": None, "download": None}},
                        torch.device("cpu"))
    return run


def test_compare_reuses_json_only_for_the_same_images(mnist_root, tmp_path):
    torch.set_num_threads(1)
    a, b = write_checkpoint(tmp_path / "a.pt", mnist_root, 0), write_checkpoint(tmp_path / "b.pt", mnist_root, 1)
    # an evaluation of a on the first 8 test images: recorded as such, and not reused for the full split
    small = evaluator([], max_images=8)(a)
    assert (small["images"], small["max_images"], small["split"]) == (8, 8, "test")
    calls = []
    result, md = compare.run(bench_cfg([a, b]), evaluator(calls))
    assert calls == ["a.pt", "b.pt"]
    assert [(r["images"], r["bpd_source"]) for r in result["rows"]] == [(16, "computed"), (16, "computed")]
    assert "| test images |" in md and " 16 |" in md
    full_a = result["rows"][0]["bits_per_dim"]
    assert full_a != pytest.approx(small["bits_per_dim"], abs=1e-9)

    # both JSONs now hold the full split: reused, nothing evaluated
    calls = []
    result, _ = compare.run(bench_cfg([a, b]), evaluator(calls))
    assert calls == [] and [r["bpd_source"] for r in result["rows"]] == ["json", "json"]
    assert result["rows"][0]["bits_per_dim"] == full_a

    # max_images=8 asks for other images than the JSONs hold: evaluated again, the table says 8
    calls = []
    result, md = compare.run(bench_cfg([a, b], max_images=8), evaluator(calls, max_images=8))
    assert calls == ["a.pt", "b.pt"] and [r["images"] for r in result["rows"]] == [8, 8]
    assert result["rows"][0]["bits_per_dim"] == pytest.approx(small["bits_per_dim"])

    # a checkpoint written again (new mtime and step) is evaluated again
    ck = torch.load(a, weights_only=True)
    ck["state"]["step"] = 9
    torch.save(ck, a)
    os.utime(a, (1e9, 1e9))
    calls = []
    compare.run(bench_cfg([a, b], max_images=8), evaluator(calls, max_images=8))
    assert calls == ["a.pt"]
    assert json.loads((tmp_path / "a.test.json").read_text())["checkpoint_step"] == 9


def test_compare_refuses_to_mix_image_counts(mnist_root, tmp_path):
    torch.set_num_threads(1)
    other_root = tmp_path / "other"
    write_mnist(other_root, n_test=8, seed=1)
    a = write_checkpoint(tmp_path / "a.pt", mnist_root, 0)        # 16 test images
    b = write_checkpoint(tmp_path / "b.pt", other_root, 1)        # 8 test images
    with pytest.raises(UserError, match=r"different image counts \(.*a.pt: 16, .*b.pt: 8\)") as e:
        compare.run(bench_cfg([a, b]), evaluator([]))
    assert "\n" not in str(e.value)
    result, _ = compare.run(bench_cfg([a, b], max_images=8), evaluator([], max_images=8))
    assert [r["images"] for r in result["rows"]] == [8, 8]


def test_compare_without_checkpoints_is_one_sentence():
    with pytest.raises(UserError, match="needs compare.checkpoints"):
        compare.run(bench_cfg([]), evaluator([]))
