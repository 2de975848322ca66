"""Running the console scripts from tests: `run` in a subprocess (what a user runs, torch and Hydra
imported afresh: seconds each, so such tests are marked slow), `call` in this process through the
same main() (for the one-sentence error tables, where the check fires before any work); both return
a CompletedProcess (returncode, stdout, stderr). Also the runs that several test files share: a
training run started in the background and stopped, killed or resumed (TRAIN, start, wait_for_step),
and torchrun runs compared with one-process runs (TEN_STEPS, torchrun, assert_close_runs)."""
import contextlib
import io
import json
import os
import subprocess
import sys
import time

TINY = ["model.n_layers=1", "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_mixtures=2",
        "train.batch_size=4", "train.val_every=3", "train.val_images=4", "train.log_every=1", "train.warmup_steps=2",
        "threads=1", "train.progress=false"]


def script(cmd):
    """'module:function' of console script `cmd`, from this checkout's pyproject.toml (a script added since
    the environment was installed has no entry point there yet)."""
    from pathlib import Path
    try:
        import tomllib
    except ImportError:          # Python 3.10: the installed entry point
        from importlib.metadata import entry_points
        return next(iter(entry_points(group="console_scripts", name=cmd))).value
    with open(Path(__file__).parent.parent / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["scripts"][cmd]


def run(cmd, *args, check=True, env=None, timeout=300):
    """env: variables to set on top of this process's."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})}
    exe = os.path.join(os.path.dirname(sys.executable), cmd)
    module, function = script(cmd).split(":")
    argv = [exe] if os.path.exists(exe) else [sys.executable, "-c", f"import sys; sys.argv[0] = {cmd!r}; "
                                                                    f"from {module} import {function}; {function}()"]
    proc = subprocess.run([*argv, *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def call(cmd, *args):
    """The console script `cmd` run in this process (torch's thread count restored after); what it
    prints to stderr when it exits with a message (sys.exit("error: ...")) is in stderr, as the
    interpreter would print it."""
    import torch

    import importlib

    module, function = script(cmd).split(":")
    main = getattr(importlib.import_module(module), function)
    out, err, argv, code, threads = io.StringIO(), io.StringIO(), sys.argv, 0, torch.get_num_threads()
    sys.argv = [cmd, *map(str, args)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
        if isinstance(e.code, str):
            err.write(e.code + "\n")
    finally:
        sys.argv = argv
        torch.set_num_threads(threads)          # threads=N sets it for the whole process
    return subprocess.CompletedProcess([cmd, *args], code, out.getvalue(), err.getvalue())


def one_line_error(proc, pattern):
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert pattern in err, err


def eval_at(checkpoint, precision):
    """imagegen-eval of checkpoint (a .pt) at `precision` -> its bits/dim; its output and the JSON it
    writes beside the checkpoint name that precision."""
    import json
    from pathlib import Path

    proc = run("imagegen-eval", f"checkpoint={checkpoint}", f"precision={precision}", "progress=false", "threads=1")
    assert precision in proc.stdout
    result = json.loads(Path(checkpoint).with_name(Path(checkpoint).stem + ".test.json").read_text())
    assert result["precision"] == precision
    return result["bits_per_dim"]


# ---------------------------------------------------------------- training runs stopped and resumed
# A tiny run that saves at every step (reliability and write tests: stopped, killed and resumed runs)
TRAIN = ["model=linear", *TINY, "train.val_every=5", "train.sample_every=0", "train.save_every=1"]

# Runs imagegen-train in this interpreter; with KILL_AT_SAVE=N it SIGKILLs itself halfway through
# writing its N-th checkpoint, as a crash during the write would; with TERM_AT_SAVE=N it sends
# itself SIGTERM as its N-th checkpoint starts (a stop request arriving during the save).
TRAIN_LAUNCHER = """
import os, signal, sys, torch
n_kill, n_term = int(os.environ.get("KILL_AT_SAVE", "0")), int(os.environ.get("TERM_AT_SAVE", "0"))
saves, real_save = [0], torch.save
def save(obj, f, *args, **kwargs):
    saves[0] += 1
    if saves[0] == n_term:
        os.kill(os.getpid(), signal.SIGTERM)
    if saves[0] == n_kill:
        f.write(b"PK half a checkpoint")
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, f, *args, **kwargs)
torch.save = save
sys.argv = ["imagegen-train", *sys.argv[1:]]
from imagegen.commands.train import main
main()
"""


def start(run_dir, root, *args, kill_at_save=0, term_at_save=0):
    """imagegen-train (TRAIN) started in the background through TRAIN_LAUNCHER; returns the Popen."""
    env = {**os.environ, "KILL_AT_SAVE": str(kill_at_save), "TERM_AT_SAVE": str(term_at_save)}
    return subprocess.Popen([sys.executable, "-c", TRAIN_LAUNCHER, *TRAIN, f"data.root={root}", f"run_dir={run_dir}",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def rows(run_dir):
    """metrics.jsonl's rows; a row still being written is left out."""
    path = run_dir / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def logged_steps(run_dir):
    """The steps metrics.jsonl holds a training loss for."""
    return [row["step"] for row in rows(run_dir) if "loss" in row]


def wait_for_step(proc, run_dir, step, resumes=0, timeout=240):
    """Waits until `proc` itself has logged a step >= `step`: the rows after the run_dir's
    `resumes`-th resume event (0: a fresh run), once that many are there. A run before it that
    went past `step` does not count, so `proc` is never stopped before it has resumed."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        seen = rows(run_dir)
        starts = [i for i, row in enumerate(seen) if row.get("event") == "resume"]
        if len(starts) == resumes:
            own = seen[starts[-1] + 1:] if starts else seen
            if any("loss" in row and row["step"] >= step for row in own):
                return
        time.sleep(0.05)
    raise AssertionError(f"the run did not reach step {step}: {proc.communicate()}")


# ---------------------------------------------------------------- distributed runs (torchrun)
# 10 steps of a tiny model; global batch 4 = 2 per rank on 2 processes; a constant learning rate after
# warmup, so that a run stopped by train.max_steps=5 is the first half of a 10-step run; float32 (under
# bfloat16 autocast the two orders of summation differ by bfloat16 round-off, not float32's)
TEN_STEPS = ["model=linear", *TINY, "train.val_every=1000", "train.sample_every=0", "train.save_every=5",
         "train.max_steps=10", "train.min_lr_ratio=1.0", "train.bf16=false"]
TOL = dict(rtol=1e-4, atol=1e-5)   # float32 round-off: the two runs sum the same gradients in another order


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*args, nproc=2):
    """`torchrun --standalone` of a module (`-m args`) on nproc processes, checked to succeed."""
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = subprocess.run([exe, "--standalone", f"--nproc_per_node={nproc}", "-m", *args], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def weights(run_dir):
    import torch
    return torch.load(run_dir / "last.pt", weights_only=True)["model"]


def assert_close_runs(a, b):
    """Two TEN_STEPS runs logged the same losses and saved the same weights (to float32 round-off)."""
    import pytest
    import torch
    la, lb = losses(a), losses(b)
    assert la.keys() == lb.keys() == set(range(1, 11))
    for step in la:
        assert la[step] == pytest.approx(lb[step], rel=1e-5), step
    wa, wb = weights(a), weights(b)
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], **TOL, msg=name)
