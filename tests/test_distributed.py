"""Training and evaluation on 2 CPU processes (gloo), as torchrun runs them: the same result as one
process, resume at another world size, and a bounded, one-sentence exit when a rank dies."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from commands import TEN_STEPS, assert_close_runs, free_port, losses, run, torchrun


def ranks(*python_args, world=2, timeout_s=None, extra_env=None):
    """The processes torchrun would start (RANK, WORLD_SIZE, MASTER_* in the environment), started by
    hand so that a test can signal one of them; python_args follow `python` ("-m", module, ...)."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **(extra_env or {})}
        timeout = [f"dist_timeout_s={timeout_s}"] if timeout_s else []
        procs.append(subprocess.Popen([sys.executable, *python_args, *timeout], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs


@pytest.mark.slow
def test_two_processes_equal_one_and_resume_at_another_world_size(mnist_root, tmp_path):
    one, two, switched = tmp_path / "one", tmp_path / "two", tmp_path / "switched"
    run("imagegen-train", *TEN_STEPS, f"data.root={mnist_root}", f"run_dir={one}")
    torchrun("imagegen.commands.train", *TEN_STEPS, f"data.root={mnist_root}", f"run_dir={two}")
    assert_close_runs(one, two)
    assert [json.loads(line)["step"] for line in (two / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line] == list(range(1, 11))      # rank 0 alone writes: one row per step

    # started on 2 processes, stopped at step 5, resumed on 1: ends where the 2-process run ends
    torchrun("imagegen.commands.train", *TEN_STEPS, f"data.root={mnist_root}", f"run_dir={switched}",
             "train.max_steps=5")
    proc = run("imagegen-train", *TEN_STEPS, f"data.root={mnist_root}", f"run_dir={switched}")
    assert "at step 5" in proc.stdout
    assert_close_runs(two, switched)


@pytest.mark.slow
def test_distributed_eval_equals_one_process(mnist_root, tmp_path):
    run("imagegen-train", *TEN_STEPS, f"data.root={mnist_root}", f"run_dir={tmp_path}", "train.max_steps=2")
    ck = tmp_path / "last.pt"
    run("imagegen-eval", f"checkpoint={ck}", "progress=false", "threads=1")
    single = json.loads((tmp_path / "last.test.json").read_text())["bits_per_dim"]
    (tmp_path / "last.test.json").unlink()
    torchrun("imagegen.commands.evaluate", f"checkpoint={ck}", "progress=false", "threads=1")
    double = json.loads((tmp_path / "last.test.json").read_text())
    assert double["images"] == 16
    assert abs(double["bits_per_dim"] - single) < 1e-9


@pytest.mark.slow
def test_a_killed_rank_stops_the_other_in_one_sentence(mnist_root, tmp_path):
    args = [*TEN_STEPS, f"data.root={mnist_root}", f"run_dir={tmp_path}", "train.max_steps=100000",
            "train.save_every=3"]
    rank0, rank1 = ranks("-m", "imagegen.commands.train", *args, timeout_s=30)
    deadline = time.time() + 300
    while time.time() < deadline and not (tmp_path / "last.pt").exists():
        time.sleep(0.1)
    rank1.send_signal(signal.SIGKILL)
    killed_at = time.time()
    out, err = rank0.communicate(timeout=120)
    assert time.time() - killed_at < 60                    # bounded by the collective timeout, not forever
    assert rank0.returncode != 0
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "another training process stopped" in lines[0], err
    assert "Traceback" not in err
    step = torch.load(tmp_path / "last.pt", weights_only=True)["state"]["step"]
    proc = run("imagegen-train", *args[:-2], f"data.root={mnist_root}", f"train.max_steps={step + 2}")
    assert f"at step {step}" in proc.stdout


@pytest.mark.slow
def test_sigterm_to_the_job_stops_every_rank_at_one_step(mnist_root, tmp_path):
    args = [*TEN_STEPS, f"data.root={mnist_root}", f"run_dir={tmp_path}", "train.max_steps=100000",
            "train.save_every=100000"]
    procs = ranks("-m", "imagegen.commands.train", *args)
    deadline = time.time() + 300
    while time.time() < deadline and not ((tmp_path / "metrics.jsonl").exists() and losses(tmp_path)):
        time.sleep(0.1)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=120) for p in procs]
    assert "stopped by SIGTERM" in outs[0][0]
    step = torch.load(tmp_path / "last.pt", weights_only=True)["state"]["step"]
    assert step >= 1 and all(p.returncode != 0 for p in procs)


# imagegen-train on one rank, reporting the gloo threads left right after its teardown; with
# "interrupt", the first step ends in KeyboardInterrupt (as a stop by signal does), so that the
# teardown runs while a traceback holds the trainer
TEARDOWN_PROBE = """
import os, sys
from imagegen.training import distributed, trainer
from imagegen.commands.train import main

def gloo_threads():
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    return sorted(n for n in names if "gloo" in n)

teardown = distributed.teardown
def reporting_teardown(world):
    teardown(world)
    print("gloo threads after teardown:", gloo_threads(), flush=True)
distributed.teardown = reporting_teardown

if sys.argv[1] == "interrupt":
    def interrupt(self):
        raise KeyboardInterrupt
    trainer.Trainer.at_step_end = interrupt
sys.argv = ["imagegen-train", *sys.argv[2:]]
main()
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc")
@pytest.mark.parametrize("end,kernel", [("done", True), ("interrupt", True), ("interrupt", False)])
def test_teardown_ends_gloo_threads(end, kernel, mnist_root, tmp_path):
    """gloo threads left running after teardown either abort the process at exit ("terminate called
    without an active exception", a thread freeing a tensor after Python finalizes) or hang it (the
    group destroyed later while holding the GIL such a thread needs); teardown must end them. Without
    the kernel, every forward is refused by it first (a refusal kept and raised again held the DDP
    wrapper's frames, and the group with them)."""
    procs = ranks("-c", TEARDOWN_PROBE, end, *TEN_STEPS, "train.max_steps=2", f"data.root={mnist_root}",
                  f"run_dir={tmp_path}", extra_env=None if kernel else {"IMAGEGEN_DISABLE_KERNEL": "1"})
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == (0 if end == "done" else 130), err   # interrupted: one line, exit 130
        assert "gloo threads after teardown: []" in out, out + err


@pytest.mark.slow
def test_batch_that_does_not_divide_is_one_sentence(mnist_root, tmp_path):
    procs = ranks("-m", "imagegen.commands.train", *TEN_STEPS, "train.batch_size=5", f"data.root={mnist_root}",
                  f"run_dir={tmp_path}")
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode != 0
        assert err.strip() == "error: train.batch_size=5 does not divide among 2 processes; use a multiple of 2.", err


@pytest.mark.slow
def test_slurm_launcher_config_composes():
    """conf/hydra/launcher/slurm.yaml extends Hydra's submitit launcher (the slurm extra, in dev)."""
    proc = run("imagegen-train", "hydra/launcher=slurm", "--cfg", "hydra")
    assert "SlurmLauncher" in proc.stdout and "gpus_per_node: 1" in proc.stdout


# ---------------------------------------------------------------- a launcher dead before the ranks were up
def test_launcher_gone_only_for_a_torchrun_rank_adopted_by_init(monkeypatch):
    from imagegen.training import signals
    monkeypatch.setattr(signals, "_launcher_is_init", lambda: False)
    monkeypatch.setattr(os, "getppid", lambda: 1)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert signals.launcher_gone() is None                    # not under torchrun: init may start us
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert "torchrun" in signals.launcher_gone()
    monkeypatch.setattr(signals, "_launcher_is_init", lambda: True)
    assert signals.launcher_gone() is None                    # torchrun is the container's pid 1
    monkeypatch.setattr(signals, "_launcher_is_init", lambda: False)
    monkeypatch.setattr(os, "getppid", lambda: 12345)
    assert signals.launcher_gone() is None                    # the launcher is our parent


def proc_state(pid):
    """The process's state letter from /proc (None once it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def gone_within(pids, seconds):
    """The pids still running (not gone, not a zombie) after up to `seconds`."""
    deadline = time.time() + seconds
    while time.time() < deadline and any(proc_state(p) not in (None, "Z") for p in pids):
        time.sleep(0.1)
    return [p for p in pids if proc_state(p) not in (None, "Z")]


def kill_all(pids):
    for p in pids:
        if proc_state(p) not in (None, "Z"):
            os.kill(p, signal.SIGKILL)


# the parent exits at once; its child, a rank as torchrun starts one (TORCHELASTIC_RUN_ID and a
# rendezvous nobody answers), runs imagegen-train's console script once it has been adopted by init
ORPHAN_PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], start_new_session=True)
print(child.pid, flush=True)
"""
ORPHAN_RANK = """
import os, sys, time
while os.getppid() != 1 and time.time() < float(sys.argv[1]):
    time.sleep(0.01)
from imagegen.commands.scripts import train
sys.argv = ["imagegen-train", *sys.argv[2:]]
train()
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process states from /proc")
def test_a_rank_whose_launcher_died_before_it_started_stops_in_one_line(mnist_root, tmp_path):
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    err_file = tmp_path / "stderr"
    with open(err_file, "w") as err:
        parent = subprocess.run([sys.executable, "-c", ORPHAN_PARENT, ORPHAN_RANK, str(time.time() + 20), *TEN_STEPS,
                                 f"data.root={mnist_root}", f"run_dir={tmp_path / 'run'}"],
                                env=env, stdout=subprocess.PIPE, stderr=err, text=True, timeout=60)
    rank = int(parent.stdout.split()[0])
    try:
        left = gone_within([rank], 30)                  # before: it waited out the 300 s rendezvous
    finally:
        kill_all([rank])
    text = err_file.read_text()
    assert not left, text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: torchrun, which started this rank, exited before "
                                                   "this training process"), text
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process trees from /proc")
@pytest.mark.parametrize("after_s", [0.0, 1.0])   # 0: before the ranks watch; 1: while they import torch
def test_torchrun_killed_while_its_ranks_start_leaves_no_rank_behind(after_s, mnist_root, tmp_path):
    bindir = os.path.dirname(sys.executable)
    launcher = subprocess.Popen([os.path.join(bindir, "torchrun"), "--standalone", "--nproc_per_node=2", "--no-python",
                                 os.path.join(bindir, "imagegen-train"), *TEN_STEPS, f"data.root={mnist_root}",
                                 f"run_dir={tmp_path}", "train.max_steps=100000"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children, deadline = [], time.time() + 120
    while len(children) < 2 and time.time() < deadline and launcher.poll() is None:
        children = [int(p) for p in os.listdir("/proc") if p.isdigit() and ppid_of(int(p)) == launcher.pid]
        time.sleep(0.005)
    time.sleep(after_s)
    launcher.kill()                                      # kill -9 while the ranks start
    launcher.wait()
    try:
        assert len(children) == 2, launcher.communicate()
        left = gone_within(children, 30)                 # before: both waited out the 300 s rendezvous
    finally:
        kill_all(children)
    out, err = launcher.communicate(timeout=60)         # the ranks' output (they held the pipes)
    assert not left, err[-3000:]
    said = [line for line in err.splitlines() if "exited" in line and ("torchrun" in line or "launcher" in line)]
    assert len(said) == 2 and "Traceback" not in err, err[-3000:]


def ppid_of(pid):
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
