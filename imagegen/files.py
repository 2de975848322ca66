"""Every file the program writes goes through here, so that every command loses nothing the same way.

A write goes to a temporary file of its own in the target's folder (created exclusively, so never
through a link someone placed there), is flushed and fsynced, then renamed over the target. The
rename replaces the target's directory entry: a symlink standing where the file goes is replaced
by the new file, never written through, so nothing outside the folder changes. Any failure
removes the temporary file and leaves the previous file as it was; it is raised as one UserError
sentence naming the path, what was kept and the reason: OSError (ENOSPC, EROFS, EACCES, ...) and
the RuntimeError of torch's zip writer (a full disk seen from torch.save) alike.

  write_bytes(path, data, what)        data: bytes
  write_with(path, writer, what)       writer(f) writes into the binary file object f
  write_owned(path, data, what, overwrite)    write_bytes, refused over a file imagegen did not write there
  check_owned(paths, what, overwrite)  write_owned's refusal for several files, checked before any is written
  image_format(path, mode)             the Pillow format path's suffix names; encode_image(image, fmt): its bytes
  write_folder(out, files, what, overwrite)   a folder of files, built beside `out` and swapped in
  write_error(path, e, kept, what)     the UserError for a failed write (also for folders: export)
  check_target(path, what)             a folder standing at path, or a file above it, refused up front
  check_replaceable(out, files, ...)   the rule of write_owned and write_folder, checked up front
  TMP_GLOB                             the temporary files' pattern; a run dir's dead ones are removed

Writers never replace what they did not write: write_owned and write_folder record what they write
(names and SHA-256: OUTPUTS beside a file, MANIFEST inside a folder) and replace a file only when the
record says that imagegen wrote it there and it has not changed since (or holds the bytes about to be
written); anything else needs overwrite=True.
"""
import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from .errors import UserError

try:
    import fcntl
except ImportError:  # Windows: record updates are not serialised
    fcntl = None

TMP_GLOB = ".*.tmp"
FIX = "free space or fix the folder's permissions, then run the same command again"
# Texts of the RuntimeErrors torch's zip writer (PyTorchStreamWriter, inline_container.cc) raises
# when the file cannot be written; any other RuntimeError is a bug and is raised as it is.
TORCH_WRITE_ERRORS = ("inline_container", "pytorchstreamwriter", "unexpected pos", "file write failed")


def tmp_path(path):
    """A temporary name unique to this process and call, in `path`'s folder, matching TMP_GLOB."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def is_write_error(e):
    return isinstance(e, OSError) or (isinstance(e, RuntimeError)
                                      and any(w in str(e).lower() for w in TORCH_WRITE_ERRORS))


def reason(e, folder=None):
    """A failed write's cause in a few words: the OS's text, or for torch's zip writer (whose message
    names no cause) the disk's state when it is full."""
    if isinstance(e, OSError):
        return e.strerror or str(e) or type(e).__name__
    if folder is not None:
        try:
            st = os.statvfs(folder)
            if st.f_bavail * st.f_frsize < (1 << 20):
                return "No space left on device"
        except OSError:
            pass
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"torch could not write the file: {first[:100]}"


def write_error(path, e, kept, what="file", fix=FIX):
    """The one-sentence UserError for a failed write of `what` at `path`; kept: what stayed as it was."""
    return UserError(f"could not write {what} {path} ({kept}): {reason(e, Path(path).parent)}; {fix}.")


def kept_note(path, what="file"):
    return f"the previous {what} is intact" if os.path.lexists(path) else "nothing was written there"


def fsync_folder(folder):
    """Make a rename in `folder` durable (best effort: some file systems refuse fsync on folders)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_target(path, what="file", example="name"):
    """UserError when no file can be written at `path`, whatever the disk: a folder stands there, or a
    folder above it is a file (example: a file name to suggest inside such a folder)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise UserError(f"{path} is a folder, and the {what} is a file; give a file name instead, e.g. "
                        f"{path / example} (nothing was written).")
    above = next((p for p in path.parents if os.path.lexists(p)), None)
    if above is not None and not above.is_dir():
        raise UserError(f"{path} cannot be written: {above} is a file, not a folder; choose a path under a folder, "
                        f"or move {above} away (nothing was written).")


def write_with(path, writer, what="file", fix=FIX, example="name"):
    """Write `path` atomically with writer(f) (f a binary file object); see the module docstring."""
    path = Path(path)
    check_target(path, what, example)
    tmp = tmp_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "wb") as f:
            writer(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if is_write_error(e):
            raise write_error(path, e, kept_note(path, what), what, fix) from None
        raise
    fsync_folder(path.parent)
    return path


def write_bytes(path, data, what="file", fix=FIX):
    """Write `data` (bytes) to `path` atomically; see the module docstring."""
    return write_with(path, lambda f: f.write(data), what, fix)


MANIFEST = ".imagegen-files.json"     # in a folder written by write_folder: {"files": {name: sha256}}
OUTPUTS = ".imagegen-outputs.json"    # beside the files written by write_owned: {"files": {name: sha256}}
# how Pillow writes a format: pictures of a few flat colours and sharp edges, kept sharp
SAVE_OPTIONS = {"JPEG": {"quality": 95}, "WEBP": {"lossless": True}}


def read_json(path, limit, what, fix):
    """The JSON value in the file at `path`, read only when it holds at most `limit` bytes; one UserError
    sentence naming the file otherwise (missing, too large, not JSON): "PATH is not a readable WHAT
    (why); FIX"."""
    path = Path(path)
    try:
        if path.stat().st_size > limit:
            raise ValueError(f"larger than {limit} bytes")
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is not a readable {what} ({e}); {fix}") from None


def sha256(path):
    """The sha256 of a file's bytes, as hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def written_before(out, record=MANIFEST):
    """{name: sha256} of the files an earlier write_folder (record=MANIFEST) or write_owned
    (record=OUTPUTS) put in folder `out` (empty when none or unreadable)."""
    try:
        kept = json.loads((Path(out) / record).read_bytes())
        return {k: v for k, v in kept["files"].items() if isinstance(k, str) and isinstance(v, str)
                and "/" not in k and k not in (".", "..")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def check_replaceable(out, files, what, overwrite, record=MANIFEST):
    """Refuse (UserError, nothing written) when folder `out` holds, under a name in `files` ({name:
    bytes to write, or None where not known yet}), a folder, or a file that imagegen did not write
    there (by `record`) or that changed since, unless `overwrite` (a file already holding the bytes
    to write is fine); a symlink counts as not ours and is replaced, never written through. Returns
    the record's {name: sha256}."""
    out = Path(out)
    owned = written_before(out, record)
    folders, foreign = [], []
    for name, data in sorted(files.items()):
        p = out / name
        if not os.path.lexists(p):
            continue
        if p.is_dir() and not p.is_symlink():
            folders.append(name)
        elif p.is_symlink() or not p.is_file():
            foreign.append(name)
        elif owned.get(name) != sha256(p) and (data is None or hashlib.sha256(data).hexdigest() != sha256(p)):
            foreign.append(name)
    if folders:
        raise UserError(f"{out} holds a folder named {', '.join(folders)} where the {what} writes a file; move it "
                        f"away or choose another out=... (nothing was written).")
    if foreign and not overwrite:
        if len(files) == 1:
            raise UserError(f"{out / foreign[0]} exists, and imagegen did not write it (or it changed since); pass "
                            f"overwrite=true to replace it (a symlink is replaced, never written through), or "
                            f"choose another out=... (nothing was written).")
        them = "it" if len(foreign) == 1 else "them"
        raise UserError(f"{out} holds {', '.join(foreign)}, which imagegen did not write there or which changed "
                        f"since; pass overwrite=true to replace {them} (a symlink is replaced, never written "
                        f"through), or choose another out=... (nothing was written).")
    return owned


def check_owned(paths, what="file", overwrite=False):
    """Refuse (UserError, nothing written) as write_owned would, for each of `paths`, before any is written:
    a command writing several files (convert's OUT.safetensors and OUT.json) writes all of them or none."""
    for path in map(Path, paths):
        check_target(path, what)
        if path.parent.is_dir():
            check_replaceable(path.parent, {path.name: None}, what, overwrite, OUTPUTS)


def write_owned(path, data, what="file", overwrite=False, fix=FIX):
    """write_bytes(path, data), refused as check_replaceable refuses (unless `overwrite`); the file's
    name and SHA-256 are then recorded in OUTPUTS in its folder, so that the same command again
    replaces it without asking. Returns path."""
    path = Path(path)
    check_target(path, what)
    with folder_turn(path.parent):
        check_replaceable(path.parent, {path.name: data}, what, overwrite, OUTPUTS)
        write_bytes(path, data, what, fix)
        owned = written_before(path.parent, OUTPUTS)
        owned = {name: digest for name, digest in owned.items() if (path.parent / name).is_file()}
        owned[path.name] = hashlib.sha256(data).hexdigest()
        try:
            write_bytes(path.parent / OUTPUTS, (json.dumps({"files": owned}, indent=1) + "\n").encode(), "record")
        except UserError as e:
            raise UserError(f"wrote {path}, but could not record it in {path.parent / OUTPUTS} ({e}); the same "
                            f"command again will need overwrite=true to replace it.") from None
    return path


@contextlib.contextmanager
def folder_turn(folder):
    """Writers into one folder take turns: an flock on the folder itself (no file added to it), held while
    write_owned reads and rewrites the folder's record, so that two samplers writing there at once both
    stay recorded, and write_folder (on the folder that holds its `out`, which it replaces whole) reads, swaps in
    and records. A folder that does not exist yet (write_bytes creates it), cannot be opened or locked: no turn."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        fd = None
    try:
        if fd is not None and fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:                     # a file system without flock: no turn, as before
                pass
        yield
    finally:
        if fd is not None:
            os.close(fd)


def image_format(path, mode="RGB"):
    """The Pillow format (PNG, JPEG, WEBP, ...) that path's suffix names, checked to write `mode`
    images ("L" grey, "RGB" colour); a UserError sentence for any other suffix."""
    from PIL import Image
    suffix = Path(path).suffix.lower()
    fmt = Image.registered_extensions().get(suffix)
    if fmt not in Image.SAVE:
        named = f"ends in {suffix}, which names no image format Pillow writes" if suffix else "has no suffix"
        raise UserError(f"{path} {named}; end it in .png, .jpg or .webp (or another suffix Pillow writes) "
                        f"(nothing was written).")
    try:
        encode_image(Image.new(mode, (2, 2)), fmt)
    except UserError:
        colour = "grey" if mode == "L" else "colour"
        raise UserError(f"Pillow cannot write {colour} images as {fmt} ({suffix}); end {path} in .png, .jpg or "
                        f".webp instead (nothing was written).") from None
    return fmt


def encode_image(image, fmt):
    """A PIL image's bytes in Pillow format `fmt` (image_format's), UserError when Pillow cannot write it."""
    buf = io.BytesIO()
    try:
        image.save(buf, format=fmt, **SAVE_OPTIONS.get(fmt, {}))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"Pillow cannot write this {image.mode} image as {fmt} ({e}); choose a .png out=... "
                        f"(nothing was written).") from None
    return buf.getvalue()


def write_folder(out, files, what="site", overwrite=False, fix=FIX):
    """Write {name: bytes} as the files of folder `out`: built in a temporary folder beside `out`,
    then swapped in (a new `out`: one rename; an `out` holding only what write_folder wrote: the
    old folder renamed aside, the new one renamed in, the old one removed; an `out` also holding
    other files: one rename per file, those other files left alone). Files it wrote before and no
    longer writes are removed. Refuses what `check_replaceable` refuses. A failure while building
    leaves `out` as it was (one UserError sentence). Returns {name: bytes written}."""
    out = Path(out)
    with folder_turn(out.parent):        # writers of one folder take turns: each reads the record the last one left
        return swap_folder(out, files, what, overwrite, fix)


def swap_folder(out, files, what, overwrite, fix):
    """write_folder's work, in its turn."""
    if os.path.lexists(out) and not out.is_dir():
        raise UserError(f"out {out} is a file, not a folder; choose another out=... (nothing was written).")
    owned = check_replaceable(out, files, what, overwrite) if out.is_dir() else {}
    record = {"files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}}
    all_files = {**files, MANIFEST: (json.dumps(record, indent=1) + "\n").encode()}
    stage = aside = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(stage, 0o777 & ~mask)
        for name, data in all_files.items():
            fd = os.open(stage / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        fsync_folder(stage)
        if not os.path.lexists(out):
            os.rename(stage, out)
            stage = None
        elif not out.is_symlink() and set(os.listdir(out)) <= set(all_files) | set(owned):
            aside = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old.", suffix=".tmp"))
            os.rename(out, aside / "site")
            try:
                os.rename(stage, out)
                stage = None
            except BaseException:
                os.rename(aside / "site", out)
                raise
        else:
            for name in all_files:
                os.replace(stage / name, out / name)
            for name, digest in owned.items():
                p = out / name
                if name not in all_files and p.is_file() and not p.is_symlink() and sha256(p) == digest:
                    p.unlink()
        fsync_folder(out.parent)
    except BaseException as e:
        if is_write_error(e):
            kept = ("nothing was written there" if not os.path.lexists(out)
                    else f"the {what} there is as it was")
            raise write_error(out, e, kept, what, fix) from None
        raise
    finally:
        for folder in (stage, aside):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
    return {name: len(data) for name, data in files.items()}
