""".ci/gpu-lease, the script a GPU lease runs (issue 43, docs/gpu.md "A lease, step by step"), where it can be
tested without a GPU: its arguments, --dry-run, and the whole lease on the CPU (--cpu) on fixture digits: a new run
trained, evaluated, sampled and packed into OUT/pack within the caps, with its report beside it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commands import TINY
from imagegen.store import pack

SCRIPT = Path(__file__).parent.parent / ".ci" / "gpu-lease"
STEPS = ["install", "data", "unpack", "train", "eval", "sample", "pack"]


def lease(*args, timeout=60):
    env = {k: v for k, v in os.environ.items() if k != "OUT"} | {"PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_arguments_are_checked(tmp_path):
    for args, said in ((("--bogus",), "unknown option --bogus"), ((), "name the folder for the trip back"),
                       (("--minutes", "ten", tmp_path), "--minutes takes a number"),
                       ((tmp_path, "--", "run_dir=x"), "the lease sets run_dir itself")):
        proc = lease(*args)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr


def test_dry_run_prints_every_step_and_runs_nothing(tmp_path):
    proc = lease("--dry-run", "--run", tmp_path / "run", "--pack", "none", tmp_path / "out", "--", "preset=cpu_cifar",
                 "data=cifar10")
    assert proc.returncode == 0, proc.stderr
    assert [line[1:line.index("]")] for line in proc.stdout.splitlines() if line.startswith("[")] == STEPS
    assert "imagegen.commands.train run_dir=" in proc.stdout and "device=cuda" in proc.stdout
    assert "preset=cpu_cifar data=cifar10" in proc.stdout
    assert f"run pack run_dir={tmp_path / 'run'} out={tmp_path / 'out' / 'pack'}" in proc.stdout
    assert not list(tmp_path.iterdir())                                   # nothing written


@pytest.mark.slow
def test_a_lease_on_the_cpu_trains_and_packs_the_run_back(mnist_root, tmp_path):
    out, run = tmp_path / "out", tmp_path / "lease" / "run"
    proc = lease("--cpu", "--minutes", "6", "--eval-images", "4", "--cifar", "none", "--pack", "none", "--run", run,
                 out, "--", "model=linear", *TINY, "train.sample_every=0", "train.max_steps=3",
                 f"data.root={mnist_root}", "data.download=false", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for step in STEPS:
        assert f"[{step}] exit 0" in proc.stdout, proc.stdout
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["lease.md", "pack/manifest.json", "pack/part-1-of-1.bin"]
    held, meta = pack.read(out / "pack")
    assert meta["step"] == 3 and {"last.pt", "best.pt", "best.test.json", "metrics.jsonl"} <= set(held)
    assert any(name.startswith("samples/lease-") and name.endswith(".png") for name in held)
    assert "## pack" in (out / "lease.md").read_text() and (tmp_path / "lease" / "logs" / "train.log").is_file()
