"""A pack: named files (bytes) carried as a few size-capped, checksummed files, so that a run folder can travel
where only a few files of a limited size go (a GPU lease: 8 files of 16 MiB back, 64 MiB up). It knows nothing
of runs (training/travel.py decides what goes in); it reads and writes only bytes and JSON, so nothing read
from a pack can run code.

  PACK/part-K-of-N.bin   the files' bytes one after the other, cut into N parts of at most max_bytes
  PACK/manifest.json     {"sha256": of this file's own bytes with that value zeroed, "format": "imagegen-pack/1",
                          "meta": {...}, "files": [{"name", "size", "sha256"}, ...] in stream order,
                          "parts": [{"name", "size", "sha256"}, ...]}

  write(out, files, meta, max_files, max_bytes, fix, overwrite)   refuses (nothing written) past the caps
  read(pack) -> (files, meta)     every byte checked: the manifest against itself, each part and each file
                                  against the manifest; a missing or changed file is one sentence naming it
"""
import hashlib
import json
import math
import os
import re
from pathlib import Path, PurePosixPath

from ..errors import UserError
from ..files import write_bytes

FORMAT = "imagegen-pack/1"
MANIFEST = "manifest.json"
PART = re.compile(r"part-(\d+)-of-(\d+)\.bin")
MIB = 1 << 20
HEAD = b'{\n "sha256": "'          # the manifest's first bytes: its own digest follows, at a fixed place
ZERO = b"0" * 64


def digest(data):
    return hashlib.sha256(data).hexdigest()


def manifest_bytes(body):
    """The manifest of `body` (a dict without "sha256"), its digest over its own bytes with the digest zeroed."""
    text = json.dumps({"sha256": ZERO.decode(), **body}, indent=1).encode() + b"\n"
    assert text.startswith(HEAD + ZERO)
    return HEAD + digest(text).encode() + text[len(HEAD) + 64:]


def plan(sizes, max_files, max_bytes):
    """The number of parts the stream of `sizes` needs, or None when they and the manifest pass max_files."""
    parts = max(1, math.ceil(sum(sizes) / max_bytes))
    return parts if parts + 1 <= max_files else None


def write(out, files, meta, max_files=8, max_bytes=16 * MIB, fix="", overwrite=False):
    """Write {name: bytes} as PACK `out` (see the module docstring); meta: JSON-able facts for the reader.
    fix: what the sentence for a pack past the caps tells the user to do. Returns the paths written."""
    out = Path(out)
    if max_files < 2 or max_bytes < 1:
        raise UserError(f"a pack needs max_files >= 2 (the manifest and a part) and max_file_mib > 0, got "
                        f"max_files={max_files}, {max_bytes} bytes per file.")
    sizes = [len(b) for b in files.values()]
    n = plan(sizes, max_files, max_bytes)
    if n is None:
        raise UserError(f"the pack would weigh {sum(sizes) / MIB:.1f} MiB, more than the {max_files - 1} parts of "
                        f"{max_bytes / MIB:.3g} MiB that max_files={max_files} allows beside its manifest; "
                        f"{fix or 'raise max_files or max_file_mib'} (nothing was written).")
    check_out(out, overwrite)
    stream = b"".join(files.values())
    parts = [stream[i * max_bytes:(i + 1) * max_bytes] for i in range(n)]
    body = {"format": FORMAT, "meta": meta,
            "files": [{"name": name, "size": len(b), "sha256": digest(b)} for name, b in files.items()],
            "parts": [{"name": f"part-{k + 1}-of-{n}.bin", "size": len(p), "sha256": digest(p)}
                      for k, p in enumerate(parts)]}
    manifest = manifest_bytes(body)
    if len(manifest) > max_bytes:
        raise UserError(f"the pack's manifest alone weighs {len(manifest):,} bytes, more than max_file_mib allows; "
                        f"raise max_file_mib (nothing was written).")
    written = [write_bytes(out / p["name"], data, "pack part") for p, data in zip(body["parts"], parts)]
    return written + [write_bytes(out / MANIFEST, manifest, "pack manifest")]     # last: a cut-short pack has none


def check_out(out, overwrite):
    """`out` new or empty; with overwrite, one holding only an earlier pack's files, which are removed."""
    if os.path.lexists(out) and not out.is_dir():
        raise UserError(f"out {out} is a file, not a folder; choose another out=... (nothing was written).")
    held = sorted(os.listdir(out)) if out.is_dir() else []
    ours = [n for n in held if n == MANIFEST or PART.fullmatch(n)]
    if held and not (overwrite and ours == held):
        other = [n for n in held if n not in ours]
        raise UserError(f"out {out} already holds {', '.join((other or held)[:3])}{' ...' if len(held) > 3 else ''}; "
                        + ("choose an empty or new folder for the pack (overwrite=true replaces only an earlier "
                           "pack's files)" if other else "pass overwrite=true to replace that pack, or choose "
                                                         "another out=...") + " (nothing was written).")
    for name in ours:
        (out / name).unlink()


def damaged(pack, name, what):
    return UserError(f"pack {pack} is damaged: {name} {what}; copy the whole pack again from where it was made "
                     f"(all the files its manifest.json lists), then run the same command again.")


def read_manifest(pack):
    path = pack / MANIFEST
    if not pack.is_dir():
        raise UserError(f"pack {pack} does not exist or is not a folder; pass pack=DIR, the folder holding "
                        f"manifest.json and the part-K-of-N.bin files.")
    if not path.is_file():
        parts = sorted(n for n in os.listdir(pack) if PART.fullmatch(n))
        if not parts:
            raise UserError(f"{pack} holds no pack (neither manifest.json nor part-K-of-N.bin files); pass pack=DIR, "
                            f"the folder imagegen-run pack wrote.")
        raise UserError(f"pack {pack} is incomplete: manifest.json is missing (it holds {', '.join(parts[:3])}"
                        f"{' ...' if len(parts) > 3 else ''}); copy the whole pack again, manifest.json included (a "
                        f"pack cut short while written has none: pack it again).")
    raw = path.read_bytes()
    claimed = raw[len(HEAD):len(HEAD) + 64]
    if not (raw.startswith(HEAD) and re.fullmatch(rb"[0-9a-f]{64}", claimed)
            and digest(HEAD + ZERO + raw[len(HEAD) + 64:]).encode() == claimed):
        raise damaged(pack, MANIFEST, "does not match its own sha256 (a byte changed, or it is not a pack's)")
    try:
        body = json.loads(raw)
    except ValueError:
        raise damaged(pack, MANIFEST, "is not JSON") from None
    if body.get("format") != FORMAT:
        raise UserError(f"pack {pack} is in format {body.get('format')!r}, which this imagegen does not read "
                        f"(it reads {FORMAT}); unpack it with the imagegen that packed it.")
    return body


def entries(body, pack, key):
    """The manifest's list `key` of {"name", "size", "sha256"}, each checked for form."""
    rows = body.get(key)
    ok = isinstance(rows, list) and all(
        isinstance(r, dict) and isinstance(r.get("name"), str) and isinstance(r.get("size"), int)
        and r["size"] >= 0 and isinstance(r.get("sha256"), str) for r in rows)
    if not ok:
        raise damaged(pack, MANIFEST, f"lists its {key} in a form this imagegen does not read")
    return rows


def safe_name(name):
    """A relative POSIX path inside the folder it is unpacked into: no absolute path, no '..', no empty part."""
    p = PurePosixPath(name)
    return bool(name) and not p.is_absolute() and "\\" not in name and all(
        part not in ("", ".", "..") for part in name.split("/"))


def read(pack):
    """{name: bytes} and meta of PACK `pack`, every byte checked (see the module docstring)."""
    pack = Path(pack)
    body = read_manifest(pack)
    parts, files = entries(body, pack, "parts"), entries(body, pack, "files")
    missing = [p["name"] for p in parts if not (pack / p["name"]).is_file()]
    if missing:
        raise UserError(f"pack {pack} is incomplete: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                        f"missing; copy all {len(parts) + 1} files that its manifest.json lists into {pack}, then "
                        f"run the same command again.")
    blobs = []
    for p in parts:
        if not PART.fullmatch(p["name"]):
            raise damaged(pack, MANIFEST, f"names a part {p['name']!r}, not part-K-of-N.bin")
        data = (pack / p["name"]).read_bytes()
        if len(data) != p["size"] or digest(data) != p["sha256"]:
            how = f"holds {len(data):,} bytes where {p['size']:,} were packed" if len(data) != p["size"] else \
                "differs from what was packed (its sha256 is not the one manifest.json records)"
            raise damaged(pack, p["name"], how)
        blobs.append(data)
    stream, out, at = b"".join(blobs), {}, 0
    if sum(f["size"] for f in files) != len(stream):
        raise damaged(pack, MANIFEST, "lists files whose sizes do not add up to its parts'")
    for f in files:
        if not safe_name(f["name"]) or f["name"] in out:
            raise damaged(pack, MANIFEST, f"names a file {f['name']!r} that cannot be unpacked safely")
        data = stream[at:at + f["size"]]
        at += f["size"]
        if digest(data) != f["sha256"]:
            raise damaged(pack, f["name"], "differs from what was packed (its sha256 is not the one manifest.json "
                                           "records)")
        out[f["name"]] = data
    return out, body.get("meta") or {}
