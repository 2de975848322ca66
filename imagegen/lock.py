"""An exclusive lock on a folder, held by an OS file lock (flock), so it dies with its process:
nothing stale remains after a crash or kill -9. The lock file records who holds it, for the
error message of the process that finds it taken."""
import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from .errors import UserError


@contextmanager
def folder_lock(folder, what="run_dir", name=".lock"):
    """Hold `folder`/`name` exclusively for the body; a second holder gets a UserError naming the first."""
    path = Path(folder) / name
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                owner = {}
            who = f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}, since {owner.get('started', '?')}"
            raise UserError(f"{what} {folder} is in use by another imagegen process ({who}); wait for it to "
                            f"finish or choose another {what}.") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0)
        yield path
    finally:
        os.close(fd)                          # closing releases the flock
