"""Issue 21: nothing lost, nothing written where it should not be. Each test drives one probe of the
issue through a console script (or, where a fault must be injected inside the process, through a
launcher running the console script's main() with one function patched) and failed before the fix.

Full disks and read-only folders are real small tmpfs mounts where the machine allows mounting
(root with CAP_SYS_ADMIN), else skipped; the injected ENOSPC/EROFS tests run everywhere."""
import contextlib
import errno
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from commands import TINY, TRAIN, call, logged_steps, one_line_error, run, start, wait_for_step
from fixtures import tiny_checkpoint

# Runs the console script named by argv[1] in this interpreter after the patch in $PATCH (Python
# source) has run: the faults that cannot be made real here (a disk filling at one exact write).
LAUNCHER = """
import errno, os, sys
exec(os.environ.get("PATCH", ""))
cmd = sys.argv[1]
sys.argv = [cmd, *sys.argv[2:]]
from importlib import import_module
module = {"imagegen-train": "train", "imagegen-sample": "sample", "imagegen-export": "export",
          "imagegen-eval": "evaluate"}
import_module("imagegen.commands." + module[cmd]).main()
"""

# torch.save's zip writer failing as on a full disk, from the N-th save on (after writing a little)
TORCH_FULL = """
import torch
_n, _real = [0], torch.save
def _save(obj, f, *a, **k):
    _n[0] += 1
    if _n[0] >= int(os.environ["FAIL_AT"]):
        f.write(b"PK half")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")
    return _real(obj, f, *a, **k)
torch.save = _save
_statvfs = os.statvfs
os.statvfs = lambda p: os.statvfs_result((4096, 4096, 100, 0, 0, 100, 0, 0, 0, 255))
"""

# os.fsync failing with $ERRNO from the $FAIL_AT-th call on (where a full disk or a file system
# remounted read-only shows itself at the latest)
FSYNC_FAILS = """
_n, _real = [0], os.fsync
def _fsync(fd):
    _n[0] += 1
    if _n[0] >= int(os.environ["FAIL_AT"]):
        code = getattr(errno, os.environ.get("ERRNO", "ENOSPC"))
        raise OSError(code, os.strerror(code))
    return _real(fd)
os.fsync = _fsync
"""


def launch(cmd, *args, patch="", **env):
    proc = subprocess.run([sys.executable, "-c", LAUNCHER, cmd, *map(str, args)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HYDRA_FULL_ERROR": "0", "PATCH": patch,
                                            **{k: str(v) for k, v in env.items()}})
    return proc


@contextlib.contextmanager
def tmpfs(path, size="1m", readonly=False):
    """A real tmpfs of `size` mounted at `path` (skips the test where mounting is not allowed)."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if readonly else "")
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                                           capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def snapshot(folder):
    """{relative path: bytes or ('link', target)} of everything under folder."""
    out = {}
    for p in sorted(Path(folder).rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = p.read_bytes()
    return out


# ---------------------------------------------------------------- the write helper
@pytest.mark.parametrize("fault", ["ENOSPC", "EROFS", "torch"])
def test_every_write_error_is_one_sentence_and_keeps_the_previous_file(tmp_path, monkeypatch, fault):
    from imagegen.store import checkpoint
    from imagegen.errors import UserError
    path = tiny_checkpoint(tmp_path / "last.pt")
    before = path.read_bytes()

    def failing(obj, f, *args, **kwargs):
        f.write(b"x" * 1000)
        if fault == "torch":      # what torch's zip writer raises on a full disk: RuntimeError, not OSError
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1000 vs 0")
        raise OSError(getattr(errno, fault), os.strerror(getattr(errno, fault)))
    monkeypatch.setattr(torch, "save", failing)
    if fault == "torch":
        monkeypatch.setattr(os, "statvfs", lambda p: os.statvfs_result((4096, 4096, 100, 0, 0, 100, 0, 0, 0, 255)))
    reason = {"ENOSPC": "No space left on device", "EROFS": "Read-only file system",
              "torch": "No space left on device"}[fault]
    with pytest.raises(UserError, match=f"could not write checkpoint {path} \\(the previous checkpoint is "
                                        f"intact\\): {reason}; "):
        checkpoint.save(path, {"config": {}, "model": {}})
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_a_symlink_at_the_temporary_name_is_never_written_through(tmp_path):
    """The metrics rewrite used the fixed temporary name metrics.jsonl.tmp: a link planted there wrote
    through to its target. Now the temporary file is created exclusively under a unique name, and a
    link standing at the target's own name is replaced, not followed."""
    from imagegen.training.logs import atomic_write
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl.tmp").symlink_to(outside)
    (run_dir / "samples.png").symlink_to(outside)
    atomic_write(run_dir / "metrics.jsonl", b"row\n")
    atomic_write(run_dir / "samples.png", b"png")
    assert outside.read_text() == "precious"
    assert (run_dir / "metrics.jsonl").read_bytes() == b"row\n"
    assert not (run_dir / "samples.png").is_symlink() and (run_dir / "samples.png").read_bytes() == b"png"


# ---------------------------------------------------------------- training: disk full, read-only
@pytest.mark.slow
def test_disk_full_during_training_is_one_sentence_and_resumes(mnist_root, tmp_path):
    """torch's zip writer fails on the 4th checkpoint write (injected): one sentence naming the file,
    the previous last.pt intact, no temporary file left, and the same command resumes."""
    args = [*TRAIN, f"data.root={mnist_root}", f"run_dir={tmp_path}", "train.max_steps=8"]
    proc = launch("imagegen-train", *args, patch=TORCH_FULL, FAIL_AT=4)
    one_line_error(proc, f"could not write checkpoint {tmp_path}/")
    assert "No space left on device" in proc.stderr and "is intact" in proc.stderr
    assert not list(tmp_path.glob(".*.tmp"))
    step = torch.load(tmp_path / "last.pt", weights_only=True)["state"]["step"]
    assert "resuming" in run("imagegen-train", *args).stdout and step >= 1


@pytest.mark.slow
def test_real_full_disk_during_training(mnist_root, tmp_path):
    """The same on a real 400 KiB tmpfs: room for last.pt and best.pt, not for a third copy."""
    with tmpfs(tmp_path / "small", "400k") as small:
        run_dir = small / "run"
        proc = run("imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={run_dir}", "train.max_steps=20",
                   "train.tensorboard=false", check=False)
        one_line_error(proc, f"could not write checkpoint {run_dir}/")
        assert not list(run_dir.glob(".*.tmp"))
        torch.load(run_dir / "last.pt", weights_only=True)        # intact


@pytest.mark.slow
@pytest.mark.parametrize("real", [False, True])
def test_read_only_run_dir_is_one_sentence(mnist_root, tmp_path, real):
    """Hydra wrote run_dir/.hydra before the project's checks ran and failed with its own OSError."""
    if real:
        ctx = tmpfs(tmp_path / "ro", "64k", readonly=True)
    else:
        ctx = contextlib.nullcontext(tmp_path / "ro")
    with ctx as ro:
        patch = "" if real else ("import pathlib\n_mk = pathlib.Path.mkdir\n"
                                 "def _mkdir(self, *a, **k):\n"
                                 "    if 'ro' in self.parts: raise OSError(errno.EROFS, 'Read-only file system', "
                                 "str(self))\n    return _mk(self, *a, **k)\npathlib.Path.mkdir = _mkdir\n")
        proc = launch("imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={ro / 'run'}", patch=patch)
        one_line_error(proc, "Read-only file system")
        assert str(ro / "run") in proc.stderr


# ---------------------------------------------------------------- a run dir belongs to one run
@pytest.mark.slow
def test_fresh_run_never_replaces_a_finished_runs_checkpoints(mnist_root, tmp_path):
    args = [*TRAIN, f"data.root={mnist_root}", f"run_dir={tmp_path}"]
    run("imagegen-train", *args, "train.max_steps=6")
    before = {name: (tmp_path / name).read_bytes() for name in ("best.pt", "last.pt", "metrics.jsonl")}
    proc = run("imagegen-train", *args, "train.max_steps=2", "train.resume=false", check=False)
    one_line_error(proc, f"run_dir {tmp_path} holds another run's last.pt and best.pt, which train.resume=false "
                         f"would replace; pass train.overwrite=true")
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    proc = run("imagegen-train", *args, "train.max_steps=2", "train.resume=false", "train.overwrite=true")
    (aside,) = tmp_path.glob("previous-*")
    assert f"moved into {aside}" in proc.stdout
    assert {name: (aside / name).read_bytes() for name in before} == before       # nothing lost
    assert logged_steps(tmp_path) == [1, 2]                                         # the new run's rows only


@pytest.mark.slow
def test_rows_of_a_run_killed_before_its_first_checkpoint_are_set_aside(mnist_root, tmp_path):
    """kill -9 before the first checkpoint, then the same command: steps appear once in metrics.jsonl."""
    args = ["train.save_every=1000", "train.val_every=1000", "train.max_steps=100000"]
    first = start(tmp_path, mnist_root, *args)
    wait_for_step(first, tmp_path, 3)
    first.kill()
    first.communicate()
    dead = logged_steps(tmp_path)
    assert dead and not (tmp_path / "last.pt").exists()
    run("imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={tmp_path}", "train.max_steps=4")
    assert logged_steps(tmp_path) == [1, 2, 3, 4]
    (aside,) = tmp_path.glob("previous-*")
    assert logged_steps(aside) == dead


@pytest.mark.slow
def test_refused_second_run_leaves_the_first_runs_config_record(mnist_root, tmp_path):
    first = start(tmp_path, mnist_root, "train.max_steps=100000", "train.save_every=50")
    wait_for_step(first, tmp_path, 2)
    second = run("imagegen-train", *TRAIN, f"data.root={mnist_root}", f"run_dir={tmp_path}", "train.max_steps=5",
                 "seed=7", check=False)
    one_line_error(second, "is in use by another imagegen process")
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)
    record = (tmp_path / ".hydra" / "config.yaml").read_text()
    assert "max_steps: 100000" in record and "seed: 0" in record
    assert "train.max_steps=100000" in (tmp_path / ".hydra" / "overrides.yaml").read_text()


def test_a_run_that_fails_before_writing_anything_leaves_no_run_dir(tmp_path):
    """Issue 45: a run dir this run created, holding nothing but its lock when the run fails, is removed;
    a folder that was there before is left where it was."""
    args = [*TRAIN, f"data.root={tmp_path / 'no-data'}", "data.download=false"]
    one_line_error(call("imagegen-train", *args, f"run_dir={tmp_path / 'runs' / 'new'}"), "MNIST not found")
    assert not (tmp_path / "runs" / "new").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    one_line_error(call("imagegen-train", *args, f"run_dir={mine}"), "MNIST not found")
    assert mine.is_dir()


# ---------------------------------------------------------------- sampling: output bounds, full disk
@pytest.mark.parametrize("args,pattern", [
    (["num_images=10000000000"], "num_images=10,000,000,000 images would need about"),
    (["mode=complete", "num_originals=100000000", "completions=1000"],
     "num_originals=100000000 x completions=1000 = 100,000,000,000 completions would need about"),
])
def test_sampling_request_too_large_is_refused_before_the_first_batch(tmp_path, args, pattern):
    path = tiny_checkpoint(tmp_path / "m.pt")
    began = time.perf_counter()
    proc = call("imagegen-sample", f"checkpoint={path}", *args, f"out={tmp_path / 'x.png'}")
    one_line_error(proc, pattern)
    assert "at most about" in proc.stderr and time.perf_counter() - began < 120
    assert not (tmp_path / "x.png").exists()


@pytest.mark.slow
@pytest.mark.parametrize("real", [False, True])
def test_full_disk_leaves_no_empty_png(tmp_path, real):
    path = tiny_checkpoint(tmp_path / "m.pt")
    ctx = tmpfs(tmp_path / "small", "8k") if real else contextlib.nullcontext(tmp_path / "out")
    with ctx as folder:
        out = folder / "grid.png"
        args = [f"checkpoint={path}", "num_images=64", "scale=8", f"out={out}", "progress=false"]
        proc = (run("imagegen-sample", *args, check=False) if real
                else launch("imagegen-sample", *args, patch=FSYNC_FAILS, FAIL_AT=1))
        one_line_error(proc, f"could not write sample grid {out} (nothing was written there): No space left on device")
        assert not out.exists() and not list(folder.glob(".*.tmp"))


# ---------------------------------------------------------------- export
@pytest.fixture
def linear_ck(tmp_path):
    return tiny_checkpoint(tmp_path / "linear.pt")


def export(ck, out, *extra, check=False):
    return run("imagegen-export", f"checkpoint={ck}", f"out={out}", "examples=0", *extra, check=check)


@pytest.mark.slow
def test_export_never_writes_through_symlinks(tmp_path, linear_ck):
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("page.js", "model.safetensors"):
        (outside / name).write_text("someone's own file")
    site = tmp_path / "site"
    site.mkdir()
    for name in ("page.js", "model.safetensors"):
        (site / name).symlink_to(outside / name)
    one_line_error(export(linear_ck, site), "model.safetensors, page.js, which imagegen did not write there")
    assert snapshot(outside) == {"model.safetensors": b"someone's own file", "page.js": b"someone's own file"}
    export(linear_ck, site, "overwrite=true", check=True)
    assert snapshot(outside) == {"model.safetensors": b"someone's own file", "page.js": b"someone's own file"}
    assert not (site / "page.js").is_symlink() and (site / "model.safetensors").stat().st_size > 100


@pytest.mark.slow
def test_export_keeps_a_users_own_files_and_replaces_its_own(tmp_path, linear_ck):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("my home page")
    (site / "notes.txt").write_text("mine")
    one_line_error(export(linear_ck, site), "holds index.html, which imagegen did not write there")
    assert (site / "index.html").read_text() == "my home page"
    export(linear_ck, tmp_path / "fresh", check=True)
    export(linear_ck, tmp_path / "fresh", check=True)                # its own files: replaced without asking
    export(linear_ck, site, "overwrite=true", check=True)
    assert (site / "notes.txt").read_text() == "mine" and "<html" in (site / "index.html").read_text().lower()


@pytest.mark.slow
def test_export_failing_halfway_leaves_the_old_site(tmp_path, linear_ck):
    site = tmp_path / "site"
    export(linear_ck, site, check=True)
    before = snapshot(site)
    (site / "worker.js").unlink()
    (site / "worker.js").mkdir()                                    # a folder in the way
    before_folder = snapshot(site)
    one_line_error(export(linear_ck, site), "holds a folder named worker.js where the site writes a file")
    assert snapshot(site) == before_folder
    (site / "worker.js").rmdir()
    (site / "worker.js").write_bytes(before["worker.js"])
    # the disk fills while the new site is built (the 3rd file's fsync): the old site stays whole
    proc = launch("imagegen-export", f"checkpoint={linear_ck}", f"out={site}", "examples=0", patch=FSYNC_FAILS,
                  FAIL_AT=3)
    one_line_error(proc, f"could not write site {site} (the site there is as it was): No space left on device")
    assert snapshot(site) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []   # no staging folder left


@pytest.mark.slow
def test_export_on_a_real_full_disk(tmp_path, linear_ck):
    with tmpfs(tmp_path / "small", "16k") as small:
        one_line_error(export(linear_ck, small / "site"), f"could not write site {small / 'site'} (nothing was "
                                                            f"written there): No space left on device")
        assert list(small.iterdir()) == []


# ---------------------------------------------------------------- launcher death, dead downloads
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
print(child.pid, flush=True)
time.sleep(600)
"""
CHILD = """
import signal, sys, time
from imagegen.training.signals import watch_parent
got = []
signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
watch_parent(interval=0.1)
open(sys.argv[1] if len(sys.argv) > 1 else "/dev/null", "w").close()
deadline = time.time() + 60
while not got and time.time() < deadline:
    time.sleep(0.05)
open(%r, "w").write("SIGTERM" if got else "none")
"""


@pytest.mark.slow
def test_parent_death_stops_a_rank_as_sigterm(tmp_path):
    marker = tmp_path / "marker"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD % str(marker)], stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    time.sleep(2)                                    # the child has imported and started watching
    parent.kill()
    parent.wait()
    deadline = time.time() + 60
    while time.time() < deadline and not marker.exists():
        time.sleep(0.1)
    assert marker.read_text() == "SIGTERM", child_pid


def ppid(proc_dir):
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@pytest.mark.slow
def test_killing_torchrun_stops_both_ranks(mnist_root, tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    launcher = subprocess.Popen([exe, "--standalone", "--nproc_per_node=2", "--no-python",
                                 os.path.join(os.path.dirname(sys.executable), "imagegen-train"), *TRAIN,
                                 f"data.root={mnist_root}", f"run_dir={tmp_path}", "train.max_steps=100000",
                                 "train.save_every=100000", "train.val_every=100000"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_step(launcher, tmp_path, 2)
    children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and ppid(p) == launcher.pid]
    assert len(children) == 2
    launcher.kill()
    launcher.wait()
    deadline = time.time() + 120

    def alive(pid):
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
        except OSError:
            return False
    while time.time() < deadline and any(alive(p) for p in children):
        time.sleep(0.2)
    assert not any(alive(p) for p in children)
    out, err = launcher.communicate()                # the ranks' output (they held the pipes until now)
    assert (tmp_path / "last.pt").exists(), (out[-3000:], err[-3000:])
    assert torch.load(tmp_path / "last.pt", weights_only=True)["state"]["step"] >= 2   # saved as on SIGTERM


@pytest.mark.slow
def test_next_download_removes_a_dead_downloads_part_file(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    dead = raw / ".train-images-idx3-ubyte.gz.abc123.part"
    dead.write_bytes(b"half a download")
    live = raw / ".train-images-idx3-ubyte.gz.live99.part"       # a download still running elsewhere
    live.write_bytes(b"in progress")
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        proc = run("imagegen-train", f"data.root={tmp_path}", f"run_dir={tmp_path / 'run'}", *TINY, check=False)
        one_line_error(proc, "could not be downloaded")                  # offline (tests/conftest.py)
        assert not dead.exists() and live.exists()
    finally:
        os.close(fd)
