"""Runs that move (imagegen-run pack / unpack, docs/runs.md): a run packed, unpacked elsewhere and resumed ends
bit-identical to a run never moved; a damaged or incomplete pack is refused in one sentence naming the file;
the caps on files and sizes hold; an unpack never overwrites a run."""
import json
import shutil

import pytest
import torch

from commands import TRAIN, call, one_line_error
from imagegen.errors import UserError
from imagegen.store import pack

STEPS = 6


def train(root, run_dir, steps):
    proc = call("imagegen-train", *TRAIN, f"data.root={root}", "data.download=false", f"run_dir={run_dir}",
                f"train.max_steps={steps}")
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def runs(mnist_root, tmp_path_factory):
    """A run of STEPS steps never moved, and one stopped halfway (its folder), packed exactly."""
    base = tmp_path_factory.mktemp("runs")
    train(mnist_root, base / "ref", STEPS)
    train(mnist_root, base / "half", STEPS // 2)
    assert call("imagegen-run", "pack", f"run_dir={base / 'half'}", f"out={base / 'pack'}").returncode == 0
    return base


def loaded(run_dir):
    return torch.load(run_dir / "last.pt", weights_only=True)


def test_a_moved_run_resumes_bit_identically(runs, mnist_root, tmp_path):
    proc = call("imagegen-run", "unpack", f"pack={runs / 'pack'}", f"run_dir={tmp_path / 'moved'}")
    assert proc.returncode == 0 and f"at step {STEPS // 2}" in proc.stdout, proc.stderr
    assert (tmp_path / "moved" / "last.pt").read_bytes() == (runs / "half" / "last.pt").read_bytes()
    best = torch.load(tmp_path / "moved" / "best.pt", weights_only=True)
    assert "optimizer" not in best and "model" in best                   # best=weights: no optimizer state
    train(mnist_root, tmp_path / "moved", STEPS)
    a, b = loaded(runs / "ref"), loaded(tmp_path / "moved")
    assert a["state"]["step"] == b["state"]["step"] == STEPS
    for name, t in a["model"].items():
        assert torch.equal(t, b["model"][name]), name
    for pid, moments in a["optimizer"]["state"].items():
        for key, t in moments.items():
            assert torch.equal(torch.as_tensor(t), torch.as_tensor(b["optimizer"]["state"][pid][key])), (pid, key)
    rows = [json.loads(line) for line in (tmp_path / "moved" / "metrics.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in rows if "loss" in r) == list(range(1, STEPS + 1))


def test_compact_keeps_the_weights_and_rounds_only_the_moments(runs, tmp_path):
    out = tmp_path / "compact"
    assert call("imagegen-run", "pack", f"run_dir={runs / 'half'}", f"out={out}", "state=compact",
                "best=none").returncode == 0
    assert call("imagegen-run", "unpack", f"pack={out}", f"run_dir={tmp_path / 'moved'}").returncode == 0
    a, b = loaded(runs / "half"), loaded(tmp_path / "moved")
    assert not (tmp_path / "moved" / "best.pt").exists()
    assert all(torch.equal(t, b["model"][k]) for k, t in a["model"].items())
    for pid, moments in a["optimizer"]["state"].items():
        got = b["optimizer"]["state"][pid]
        assert got["exp_avg"].dtype == torch.float32 and torch.equal(got["step"], moments["step"])
        assert torch.equal(got["exp_avg_sq"], moments["exp_avg_sq"].bfloat16().float())
    exact = sum(p.stat().st_size for p in (runs / "pack").iterdir())
    assert sum(p.stat().st_size for p in out.iterdir()) < exact


def copy_pack(runs, tmp_path):
    shutil.copytree(runs / "pack", tmp_path / "pack")
    return tmp_path / "pack"


@pytest.mark.parametrize("name", ["part-1-of-1.bin", "manifest.json"])
def test_one_changed_byte_is_refused_naming_the_file(runs, tmp_path, name):
    p = copy_pack(runs, tmp_path) / name
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 1
    p.write_bytes(bytes(data))
    proc = call("imagegen-run", "unpack", f"pack={p.parent}", f"run_dir={tmp_path / 'moved'}")
    one_line_error(proc, f"is damaged: {name} ")
    assert "copy the whole pack again" in proc.stderr
    assert not (tmp_path / "moved").exists()                              # nothing written


@pytest.mark.parametrize("name", ["part-1-of-1.bin", "manifest.json"])
def test_a_missing_file_is_refused_naming_it(runs, tmp_path, name):
    p = copy_pack(runs, tmp_path) / name
    p.unlink()
    proc = call("imagegen-run", "unpack", f"pack={p.parent}", f"run_dir={tmp_path / 'moved'}")
    one_line_error(proc, f"is incomplete: {name}")
    assert not (tmp_path / "moved").exists()


def test_a_folder_that_is_no_pack_is_named_as_such(runs, tmp_path):
    one_line_error(call("imagegen-run", "unpack", f"pack={runs / 'half'}", f"run_dir={tmp_path / 'moved'}"),
                   "holds no pack (neither manifest.json nor part-K-of-N.bin files)")


def test_a_damaged_run_is_not_packed(runs, tmp_path):
    shutil.copytree(runs / "half", tmp_path / "run")
    last = tmp_path / "run" / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])
    one_line_error(call("imagegen-run", "pack", f"run_dir={tmp_path / 'run'}", f"out={tmp_path / 'out'}"),
                   "is not a readable checkpoint")
    assert not (tmp_path / "out").exists()


def test_the_caps_hold_and_a_pack_past_them_is_refused(runs, tmp_path):
    out, cap = tmp_path / "small", 0.06                                   # MiB per file: several parts
    assert call("imagegen-run", "pack", f"run_dir={runs / 'half'}", f"out={out}", f"max_file_mib={cap}",
                "max_files=20").returncode == 0
    files = sorted(out.iterdir())
    assert len(files) > 3 and all(p.stat().st_size <= cap * 2 ** 20 for p in files)
    assert call("imagegen-run", "unpack", f"pack={out}", f"run_dir={tmp_path / 'moved'}").returncode == 0
    assert (tmp_path / "moved" / "last.pt").read_bytes() == (runs / "half" / "last.pt").read_bytes()
    proc = call("imagegen-run", "pack", f"run_dir={runs / 'half'}", f"out={tmp_path / 'refused'}",
                f"max_file_mib={cap}", f"max_files={len(files) - 1}")
    one_line_error(proc, f"more than the {len(files) - 2} parts of {cap:g} MiB")
    assert "state=compact" in proc.stderr and not (tmp_path / "refused").exists()
    one_line_error(call("imagegen-run", "pack", f"run_dir={runs / 'half'}", f"out={out}"), "already holds")


def test_unpack_never_overwrites_a_run(runs, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(runs / "ref", target)
    before = (target / "last.pt").read_bytes()
    one_line_error(call("imagegen-run", "unpack", f"pack={runs / 'pack'}", f"run_dir={target}"),
                   "already holds a run's files")
    assert (target / "last.pt").read_bytes() == before
    assert call("imagegen-run", "unpack", f"pack={runs / 'pack'}", f"run_dir={target}",
                "overwrite=true").returncode == 0
    (aside,) = target.glob("previous-*")
    assert (aside / "last.pt").read_bytes() == before
    assert loaded(target)["state"]["step"] == STEPS // 2


def test_a_refused_unpack_leaves_nothing_in_the_users_folder(runs, tmp_path):
    """issue 54 row 12: the refusal said "nothing was written" but left the run dir's .lock there."""
    target = tmp_path / "mine"
    target.mkdir()
    (target / "last.pt").write_text("my own file")
    one_line_error(call("imagegen-run", "unpack", f"pack={runs / 'pack'}", f"run_dir={target}"),
                   "(nothing was written)")
    assert sorted(p.name for p in target.iterdir()) == ["last.pt"]


@pytest.mark.parametrize("existing", [False, True])
def test_an_interrupted_unpack_leaves_nothing_or_what_was_there(runs, tmp_path, monkeypatch, existing):
    """issue 54 row 7: Ctrl-C during unpack left .hydra and best.pt without last.pt, and the next imagegen-train
    started over from step 0."""
    from imagegen.training import travel

    target = tmp_path / "run"
    if existing:
        shutil.copytree(runs / "ref", target)
    before = {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()} if existing else None
    real, calls = travel.write_bytes, []

    def interrupted_at_the_second_file(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(travel, "write_bytes", interrupted_at_the_second_file)
    with pytest.raises(KeyboardInterrupt):
        travel.unpack_run(runs / "pack", target, overwrite=True, say=lambda line: None)
    if existing:
        assert {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()} == before
    else:
        assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["run"] if existing else [])      # no staging folder
    monkeypatch.setattr(travel, "write_bytes", real)
    assert travel.unpack_run(runs / "pack", target, overwrite=True, say=lambda line: None) == STEPS // 2
    assert loaded(target)["state"]["step"] == STEPS // 2 and (target / ".hydra").is_dir()


def test_a_pack_cannot_write_outside_its_run_dir(tmp_path):
    """The manifest's checksum is no signature: a made-up pack with consistent digests is still refused when
    it names a path outside the run folder."""
    pack.write(tmp_path / "evil", {"last.pt": b"x", "../outside.txt": b"y"}, {"kind": "run"})
    proc = call("imagegen-run", "unpack", f"pack={tmp_path / 'evil'}", f"run_dir={tmp_path / 'run'}")
    one_line_error(proc, "cannot be unpacked safely")
    assert not (tmp_path / "outside.txt").exists()


def test_read_checks_every_part(tmp_path):
    files = {"a": bytes(range(256)) * 40, "b/c": b"hello"}
    pack.write(tmp_path / "p", files, {"k": 1}, max_files=5, max_bytes=4000)
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == [
        "manifest.json", "part-1-of-3.bin", "part-2-of-3.bin", "part-3-of-3.bin"]
    assert pack.read(tmp_path / "p") == (files, {"k": 1})
    (tmp_path / "p" / "part-3-of-3.bin").write_bytes(b"")
    with pytest.raises(UserError, match="part-3-of-3.bin holds 0 bytes where"):
        pack.read(tmp_path / "p")
