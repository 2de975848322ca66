"""Exclusive locks held by an OS file lock (flock), so they die with their process: nothing stale
remains after a crash or kill -9. The lock file records who holds it (pid, host, start), for the
message of the process that finds it taken. Used for the run dir (a second run is refused) and the
kernel build (a second builder waits). Without fcntl (Windows) nothing is locked."""
import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from .errors import UserError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


@contextmanager
def exclusive(path, busy):
    """Hold an flock on `path` for the body. When another process holds it, `busy(owner)` is called
    first with the holder's record (a dict, maybe empty): it raises to refuse, or returns to wait."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
                except ValueError:
                    owner = {}
                busy(owner)
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                      "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0)
        yield path
    finally:
        os.close(fd)                          # closing releases the flock


@contextmanager
def folder_lock(folder, what="run_dir", name=".lock", created=False, scratch=()):
    """Hold `folder`/`name` for the body; a second holder gets a UserError naming the first.
    created: this process made `folder` for the body, and removes it again (still holding the lock)
    when the body leaves nothing in it but the lock and the `scratch` entries (a run that failed before
    writing anything but its config record .hydra)."""
    def refuse(owner):
        who = f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}, since {owner.get('started', '?')}"
        raise UserError(f"{what} {folder} is in use by another imagegen process ({who}); wait for it to "
                        f"finish or choose another {what}.")
    folder = Path(folder)
    with exclusive(folder / name, refuse) as path:
        try:
            yield path
        finally:
            if created:
                remove_if_only(folder, name, scratch)


def remove_if_only(folder, name, scratch=()):
    """Remove `folder` when it holds nothing but the file `name` and entries named in `scratch` (best
    effort: anything else that appears there meanwhile keeps it)."""
    import shutil

    try:
        held = set(os.listdir(folder))
        if name in held and held - {name} <= set(scratch):
            for entry in held - {name}:
                shutil.rmtree(folder / entry) if (folder / entry).is_dir() else os.unlink(folder / entry)
            os.unlink(folder / name)
            os.rmdir(folder)
    except OSError:
        pass
