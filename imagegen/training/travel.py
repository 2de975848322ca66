"""Runs that move: what a run folder holds, packed for a trip (store/pack.py knows the format) and unpacked on
another machine, where `imagegen-train run_dir=NEW ...` resumes it (docs/runs.md).

  pack_run(run_dir, out, state, best, ...)   the run's record (rundir.RECORD_GLOBS): last.pt as it is (state=exact:
                                   the resume is bit-identical to a run never moved) or with the optimizer's
                                   moments in bfloat16 (state=compact: lossy, measured in docs/runs.md); best.pt
                                   without its optimizer state (best=weights: nothing resumes from best.pt), whole
                                   (best=full) or left behind (best=none); metrics, samples, .hydra, *.json as they are
  unpack_run(pack, run_dir, overwrite)   every byte checked, last.pt checked as a checkpoint to resume from and
                                   its moments back in float32, written into a new (or empty) run_dir; a run_dir
                                   holding a run is refused, or with overwrite=true that run's files are moved
                                   into run_dir/previous-<time>/ first. Atomic: written beside run_dir, then
                                   renamed in (`swap_in`); an interrupted unpack leaves nothing, or what was there
"""
import fnmatch
import io
import os
import shutil
import signal
import tempfile
from pathlib import Path

import torch

from ..errors import UserError
from ..files import write_bytes
from ..lock import folder_lock
from ..say import show
from ..store import checkpoint, checks, pack
from . import rundir

STATES = ("exact", "compact")
BESTS = ("weights", "full", "none")
MOMENTS = ("exp_avg", "exp_avg_sq")          # Adam's (and AdamW's, RAdam's) moments; "step" stays as it is


def record_files(run_dir):
    """{relative name: path} of the files of the run's record, folders (samples/, .hydra/) walked; links are
    left out (never followed)."""
    out = {}
    for p in rundir.previous_files(run_dir):
        if p.is_symlink():
            continue
        inner = sorted(q for q in p.rglob("*") if q.is_file() and not q.is_symlink()) if p.is_dir() else [p]
        out.update({q.relative_to(run_dir).as_posix(): q for q in inner})
    return out


def in_record(name):
    """Whether a pack's file name belongs to a run's record (its first part matches rundir.RECORD_GLOBS)."""
    first = name.split("/")[0]
    return any(fnmatch.fnmatchcase(first, g) for g in rundir.RECORD_GLOBS) and (
        "/" not in name or first in ("samples", ".hydra"))


def saved(ck):
    buf = io.BytesIO()
    torch.save(ck, buf)
    return buf.getvalue()


def compact_moments(ck):
    """The checkpoint with each parameter's Adam moments as bfloat16 (a copy; the tensors are new)."""
    opt = ck["optimizer"]
    state = {pid: {k: (v.to(torch.bfloat16) if k in MOMENTS and v.is_floating_point() else v) for k, v in s.items()}
             for pid, s in opt["state"].items()}
    return {**ck, "optimizer": {**opt, "state": state}}


def widened_moments(ck):
    """The checkpoint with bfloat16 moments back in float32 (the dtype Adam keeps them in); exact ones as they are."""
    opt = ck["optimizer"]
    for s in opt["state"].values():
        for k in MOMENTS:
            if isinstance(s.get(k), torch.Tensor) and s[k].dtype == torch.bfloat16:
                s[k] = s[k].float()
    return ck


def load_bytes(data, name):
    """A checkpoint read from bytes (weights_only: nothing in it can run), checked as checkpoint.load checks files."""
    try:
        ck = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, pickle garbage, foreign objects
        raise UserError(f"{name} in the pack is not a readable checkpoint ({checks.load_reason(e)}); pack the run "
                        f"again.") from None
    return checks.check(ck, name)


def pack_run(run_dir, out, state="exact", best="weights", max_files=8, max_mib=16.0, overwrite=False, say=show):
    """Pack the run in `run_dir` into PACK `out` (see the module docstring); returns the paths written."""
    run_dir = Path(run_dir).expanduser()
    if state not in STATES or best not in BESTS:
        raise UserError(f"state must be one of {', '.join(STATES)} and best one of {', '.join(BESTS)}; got "
                        f"state={state}, best={best}.")
    if not (run_dir / "last.pt").is_file():
        raise UserError(f"run_dir {run_dir} holds no last.pt, so there is no run to pack; pass the run_dir of "
                        f"imagegen-train.")
    with folder_lock(run_dir):            # not while a run writes it: its last.pt could be half a step old
        last = checkpoint.load(run_dir / "last.pt")           # a damaged run is refused here, not packed
        checks.check_training(last, run_dir / "last.pt")
        files = {}
        for name, path in record_files(run_dir).items():
            if name == "best.pt" and best == "none":
                continue
            data = path.read_bytes()
            if name == "last.pt" and state == "compact":
                data = saved(compact_moments(last))
            elif name == "best.pt" and best == "weights":
                data = saved({k: v for k, v in checkpoint.load(path).items() if k != "optimizer"})
            files[name] = data
        step = last["state"]["step"]
        meta = {"kind": "run", "run": run_dir.resolve().name, "step": step, "state": state, "best": best}
        fix = ("pack with state=compact (the optimizer's moments in bfloat16)" if state == "exact" else
               "leave best.pt behind (best=none)" if best != "none" else "raise max_files or max_file_mib")
        written = pack.write(out, files, meta, max_files, int(max_mib * pack.MIB), fix=fix, overwrite=overwrite)
    size = sum(p.stat().st_size for p in written)
    say(f"packed {run_dir} (step {step}, {len(files)} files, state={state}, best={best}) into {out}: "
        f"{len(written)} files, {size / pack.MIB:.1f} MiB")
    return written


def held_run(run_dir, overwrite):
    """The run files that run_dir holds (rundir.previous_files); a UserError when it holds some and not `overwrite`."""
    held = rundir.previous_files(run_dir)
    if held and not overwrite:
        raise UserError(f"run_dir {run_dir} already holds a run's files ({', '.join(p.name for p in held[:3])}"
                        f"{' ...' if len(held) > 3 else ''}); choose a new run_dir=..., or pass overwrite=true "
                        f"to move them into {run_dir}/previous-<time>/ first (nothing was written).")
    return held


def swap_in(stage, run_dir, overwrite, say):
    """The files of folder `stage` (beside run_dir) become run_dir's: a new run_dir is one rename; into an existing
    one (a run there set aside first, with overwrite) each file is renamed in, last.pt last, with Ctrl-C and SIGTERM
    held back until the renames are done (a stop then acts after them), so that run_dir holds the whole run or
    what it held before."""
    if not os.path.lexists(run_dir):
        os.rename(stage, run_dir)
        return
    with folder_lock(run_dir):
        held = held_run(run_dir, overwrite)
        stops = {signal.SIGINT, signal.SIGTERM}
        hold = getattr(signal, "pthread_sigmask", lambda how, signals: None)      # Windows: nothing held back
        hold(signal.SIG_BLOCK, stops)
        try:
            if held:
                say(f"moved the files it held into {rundir.set_aside(run_dir, held)}")
            for entry in sorted(os.listdir(stage), key=lambda name: name == "last.pt"):
                os.replace(stage / entry, run_dir / entry)
        finally:
            hold(signal.SIG_UNBLOCK, stops)


def unpack_run(pack_dir, run_dir, overwrite=False, say=show):
    """Unpack PACK `pack_dir` into `run_dir` (see the module docstring); returns the run's step."""
    run_dir = Path(run_dir).expanduser()
    files, meta = pack.read(pack_dir)
    if meta.get("kind") != "run" or "last.pt" not in files:
        raise UserError(f"pack {pack_dir} holds no run (no last.pt); pass the pack written by imagegen-run pack.")
    bad = next((n for n in files if not in_record(n)), None)
    if bad:
        raise pack.damaged(pack_dir, "manifest.json", f"names {bad!r}, which is no file of a run")
    last = widened_moments(load_bytes(files["last.pt"], "last.pt"))
    checks.check_training(last, "last.pt")
    if meta.get("state") != "exact":
        files["last.pt"] = saved(last)
    if "best.pt" in files:
        load_bytes(files["best.pt"], "best.pt")
    if os.path.lexists(run_dir) and not run_dir.is_dir():
        raise UserError(f"run_dir {run_dir} is a file, not a folder; choose another run_dir=... (nothing was "
                        f"written).")
    held_run(run_dir, overwrite)           # refused before anything (the lock file too) is written there
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=run_dir.parent, prefix=f".{run_dir.name}.", suffix=".tmp"))
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(stage, 0o777 & ~mask)         # the run_dir it becomes: a folder as mkdir makes it, not mkdtemp's 0700
    try:                                   # every file written beside run_dir first: a stop here leaves nothing
        for name, data in files.items():
            write_bytes(stage / name, data, "run file")
        swap_in(stage, run_dir, overwrite, say)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    step = last["state"]["step"]
    say(f"unpacked {pack_dir} into {run_dir}: {meta.get('run', 'a run')} at step {step}, {len(files)} files"
        + (" (its optimizer's moments were packed in bfloat16)" if meta.get("state") == "compact" else "")
        + f"; imagegen-train run_dir={run_dir} with the run's settings resumes it")
    return step
