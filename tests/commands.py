"""Running the console scripts from tests: `run` in a subprocess (what a user runs, torch and Hydra
imported afresh: seconds each, so such tests are marked slow), `call` in this process through the
same main() (for the one-sentence error tables, where the check fires before any work); both return
a CompletedProcess (returncode, stdout, stderr)."""
import contextlib
import io
import os
import subprocess
import sys
from importlib.metadata import entry_points

TINY = ["model.n_layers=1", "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_mixtures=2",
        "train.batch_size=4", "train.val_every=3", "train.val_images=4", "train.log_every=1", "train.warmup_steps=2",
        "threads=1", "train.progress=false"]


def run(cmd, *args, check=True, env=None, timeout=300):
    """env: variables to set on top of this process's."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})}
    exe = os.path.join(os.path.dirname(sys.executable), cmd)
    proc = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def call(cmd, *args):
    """The console script `cmd` run in this process (torch's thread count restored after); what it
    prints to stderr when it exits with a message (sys.exit("error: ...")) is in stderr, as the
    interpreter would print it."""
    import torch

    main = next(iter(entry_points(group="console_scripts", name=cmd))).load()
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
