"""The label-accuracy judge (tools.label_accuracy) on a colour model: its table's
columns, and a judge file that is written once and read back (the same test accuracy); samples at int8."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from commands import TINY, one_line_error, run
from tools.label_accuracy import main


@pytest.mark.slow
def test_judge_reads_a_colour_model_and_reuses_its_classifier(cifar_root, tmp_path):
    run("imagegen-train", "data=cifar10", f"data.root={cifar_root}", f"run_dir={tmp_path / 'run'}",
        "train.max_steps=1", "model.num_classes=10", *TINY)
    args = ["--checkpoint", str(tmp_path / "run" / "last.pt"), "--data-root", str(cifar_root), "--guidance", "1",
            "3", "--per-class", "1", "--epochs", "1", "--threads", "1", "--judge", str(tmp_path / "judge.pt")]
    main([*args, "--out-dir", str(tmp_path / "a")])
    assert (tmp_path / "judge.pt").is_file()
    main([*args, "--out-dir", str(tmp_path / "b"), "--precision", "int8"])   # the saved judge, not a new one
    a, b = (json.loads((tmp_path / d / "label_accuracy.json").read_text()) for d in "ab")
    assert a["classifier_test_accuracy"] == b["classifier_test_accuracy"]
    for row in a["rows"]:
        assert row["samples"] == 10 and 0 <= row["recognised"] <= 1 and 0 < row["confidence"] <= 1
        assert 0 < row["samples_bpd"] < 16
    assert "airplane" in (tmp_path / "a" / "label_accuracy.md").read_text()    # the classes by name
    assert [row["precision"] for row in a["rows"] + b["rows"]] == ["float32"] * 2 + ["int8"] * 2
    assert "small CNN" in a["judge"] and "small CNN" in b["judge"]
    main([*args[:-2], "--guidance", "1", "--out-dir", str(tmp_path / "c")])   # no --judge: the shipped colour judge
    c = json.loads((tmp_path / "c" / "label_accuracy.json").read_text())
    assert c["judge"].startswith("cifar10.safetensors") and "cifar10.safetensors" in (
        tmp_path / "c" / "label_accuracy.md").read_text()


def test_benchmark_scripts_end_a_user_error_with_one_line(tmp_path):
    """python -m tools.label_accuracy without its data: one line naming the fix, no traceback
    (every argparse benchmark's __main__ runs through errors.one_line)."""
    proc = subprocess.run([sys.executable, "-m", "tools.label_accuracy", "--data-root",      # offline: conftest
                           str(tmp_path / "nowhere"), "--per-class", "1"], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])     # tools/ is run from the root
    one_line_error(proc, "MNIST not found in")
