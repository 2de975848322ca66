""".ci/gpu-check, the GPU check of issue 33, where it can be tested without a GPU: its arguments,
--dry-run (the steps, nothing run, nothing written) and the one line it says without a CUDA GPU."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / ".ci" / "gpu-check"
STEPS = ["install", "cuda-tests", "sampling-cuda", "sampling-colour", "train", "attention-bench", "attention-kernel"]


def gpu_check(*args, env=None):
    env = {k: v for k, v in os.environ.items() if k != "OUT"} | (env or {})
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.slow
def test_dry_run_prints_every_step_and_runs_nothing(tmp_path):
    out = tmp_path / "report"
    for args, env in (((str(out), "--dry-run"), None), (("--dry-run",), {"OUT": str(out)})):
        proc = gpu_check(*args, env=env)
        assert proc.returncode == 0, proc.stderr
        names = [line[1:line.index("]")] for line in proc.stdout.splitlines() if line.startswith("[")]
        assert names == STEPS
        assert f"report: {out}/gpu-check.md" in proc.stdout
        assert "imagegen-bench mode=attention device=cuda 'attention.impls=[softmax,triton]' " \
               "'attention.lengths=[784,3072,8192]'" in proc.stdout
        assert "imagegen-train device=cuda train.max_minutes=0.5" in proc.stdout
        assert "-m pytest -q -ra -m cuda tests/" in proc.stdout
        assert not out.exists()                                     # nothing written


@pytest.mark.slow
def test_arguments_are_checked(tmp_path):
    for args, said in ((("--bogus",), "unknown option --bogus"), ((), "name the report's folder"),
                       ((str(tmp_path / "a"), str(tmp_path / "b")), "one OUT_DIR only")):
        proc = gpu_check(*args)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    proc = gpu_check("--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: .ci/gpu-check")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine may have a GPU: the check would run")
def test_without_a_gpu_one_line_and_exit_0(tmp_path):
    proc = gpu_check(str(tmp_path / "report"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "gpu-check: no CUDA GPU here (nvidia-smi finds none): nothing run.\n" and proc.stderr == ""
    assert not (tmp_path / "report").exists()
