"""imagegen-sample's outputs follow the rule of the export site (files.py): a file is replaced only when
imagegen wrote it there and it has not changed since, else refused in one sentence unless overwrite=true;
the image is written in the format its suffix names (issue 45). Each test failed before the fix."""
import pytest
from PIL import Image

from commands import call, one_line_error
from fixtures import tiny_checkpoint

from imagegen.errors import UserError
from imagegen.files import OUTPUTS, image_format


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ck") / "m.pt")


def sample(ck, out, *args):
    return call("imagegen-sample", f"checkpoint={ck}", f"out={out}", "num_images=4", "nrow=2", "scale=1",
                "batch_size=4", "progress=false", "threads=1", *args)


def test_save_each_never_replaces_a_users_file_in_its_folder(ck, tmp_path):
    folder = tmp_path / "se"
    folder.mkdir()
    (folder / "0000.png").write_text("mine")
    (folder / "notes.txt").write_text("also mine")
    one_line_error(sample(ck, tmp_path / "se.png", "save_each=true"),
                   f"{folder} holds 0000.png, which imagegen did not write there or which changed since; pass "
                   f"overwrite=true to replace it")
    assert (folder / "0000.png").read_text() == "mine" and not (tmp_path / "se.png").exists()   # refused up front
    assert sample(ck, tmp_path / "se.png", "save_each=true", "overwrite=true").returncode == 0
    assert sorted(p.name for p in folder.iterdir()) == [".imagegen-files.json", "0000.png", "0001.png", "0002.png",
                                                        "0003.png", "notes.txt"]
    assert Image.open(folder / "0000.png").size == (28, 28) and (folder / "notes.txt").read_text() == "also mine"
    # its own files: replaced without asking; those of the earlier, larger request removed, the user's kept
    assert sample(ck, tmp_path / "se.png", "save_each=true", "num_images=2").returncode == 0
    assert sorted(p.name for p in folder.iterdir()) == [".imagegen-files.json", "0000.png", "0001.png", "notes.txt"]


def test_out_never_replaces_a_file_imagegen_did_not_write(ck, tmp_path):
    essay = tmp_path / "essay.webp"            # an essay under an image suffix: the user's file
    essay.write_text("my essay")
    one_line_error(sample(ck, essay), f"{essay} exists, and imagegen did not write it (or it changed since); pass "
                                      f"overwrite=true to replace it")
    assert essay.read_text() == "my essay"
    png = tmp_path / "digits.png"
    Image.new("L", (3, 3)).save(png)                     # a PNG, but not one imagegen wrote
    one_line_error(sample(ck, png), "imagegen did not write it")
    assert Image.open(png).size == (3, 3)
    assert sample(ck, png, "overwrite=true").returncode == 0
    first = png.read_bytes()
    assert sample(ck, png, "seed=1").returncode == 0                 # the same command again: its own file
    assert png.read_bytes() != first and OUTPUTS in {p.name for p in tmp_path.iterdir()}
    png.write_bytes(png.read_bytes() + b"edited")                    # changed since: the user's now
    one_line_error(sample(ck, png), "imagegen did not write it (or it changed since)")
    link = tmp_path / "link.png"
    link.symlink_to(essay)
    one_line_error(sample(ck, link), "imagegen did not write it")
    assert sample(ck, link, "overwrite=true").returncode == 0
    assert essay.read_text() == "my essay" and not link.is_symlink()    # replaced, never written through


@pytest.mark.parametrize("suffix, fmt", [(".jpg", "JPEG"), (".JPEG", "JPEG"), (".webp", "WEBP"), (".png", "PNG"),
                                         (".bmp", "BMP")])
def test_out_is_written_in_the_format_its_suffix_names(ck, tmp_path, suffix, fmt):
    out = tmp_path / f"digits{suffix}"
    assert sample(ck, out, "save_each=true").returncode == 0
    assert Image.open(out).format == fmt and Image.open(tmp_path / "digits" / f"0003{suffix}").format == fmt


@pytest.mark.parametrize("name, says", [("digits.txt", "ends in .txt, which names no image format Pillow writes"),
                                        ("digits", "has no suffix"),
                                        ("digits.xbm", "Pillow cannot write grey images as XBM")])
def test_a_suffix_that_names_no_writable_format_is_one_sentence(ck, tmp_path, name, says):
    one_line_error(sample(ck, tmp_path / name), says)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UserError, match="end it in .png, .jpg or .webp"):
        image_format("x.docx")


def test_a_fresh_run_in_the_run_dir_leaves_the_samplers_record_beside_its_images(tmp_path):
    """train.overwrite=true moves a run's record aside (rundir.previous_files), but not the record of the
    sample grids that stay beside the new checkpoints: sampling the new run again needs no overwrite=true."""
    from imagegen.training import rundir
    tiny_checkpoint(tmp_path / "best.pt")
    assert call("imagegen-sample", f"checkpoint={tmp_path / 'best.pt'}", "num_images=2", "progress=false",
                "threads=1").returncode == 0                                  # default out: best-grid.png beside it
    old = rundir.previous_files(tmp_path)
    assert [p.name for p in old] == ["best.pt"]
    rundir.set_aside(tmp_path, old)
    tiny_checkpoint(tmp_path / "best.pt")                                      # the new run's
    assert call("imagegen-sample", f"checkpoint={tmp_path / 'best.pt'}", "num_images=2", "progress=false",
                "threads=1").returncode == 0


def test_two_writers_into_one_folder_both_stay_recorded(tmp_path, monkeypatch):
    """Two samplers writing into one folder at once: each reads the record, then rewrites it. Without taking
    turns the slower one's rewrite dropped the other's entry (its next run then asked for overwrite=true);
    the read is slowed here so that the two would overlap every time."""
    import threading
    import time

    from imagegen import files

    real = files.written_before

    def slow(*args):
        kept = real(*args)
        time.sleep(0.3)
        return kept

    monkeypatch.setattr(files, "written_before", slow)
    (tmp_path / "seed.txt").write_text("")                    # the folder exists, as a sampler's out folder does
    writers = [threading.Thread(target=files.write_owned, args=(tmp_path / f"{n}.png", n.encode(), "grid"))
               for n in ("a", "b")]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    assert sorted(files.written_before(tmp_path, files.OUTPUTS)) == ["a.png", "b.png"]


def test_two_folder_writers_at_once_leave_a_record_that_holds_every_file(tmp_path, monkeypatch):
    """issue 54 row 8: two `imagegen-sample save_each=true` into one folder at once (8 and 4 images): the second
    read the record before the first swapped its folder in, so its record left out 4 of the first's files, and the
    next run refused imagegen's own files. The read is slowed and the second writer started a little later, so
    that the two would overlap every time."""
    import threading
    import time

    from imagegen import files

    real = files.written_before

    def slow(*args):
        kept = real(*args)
        time.sleep(0.3)
        return kept

    out = tmp_path / "cc"
    files.write_folder(out, {f"{i:04d}.png": b"earlier %d" % i for i in range(8)}, "samples")   # an earlier run's
    monkeypatch.setattr(files, "written_before", slow)
    eight = {f"{i:04d}.png": b"first %d" % i for i in range(8)}
    four = {f"{i:04d}.png": b"second %d" % i for i in range(4)}
    errors = []

    def write(batch):
        try:
            files.write_folder(out, batch, "samples")
        except Exception as e:                  # imagegen's own files refused as the user's
            errors.append(e)

    first = threading.Thread(target=write, args=(eight,))
    second = threading.Thread(target=write, args=(four,))
    first.start()
    time.sleep(0.1)
    second.start()
    for w in (first, second):
        w.join()
    monkeypatch.setattr(files, "written_before", real)
    assert errors == []
    recorded = files.written_before(out)
    assert sorted(recorded) == sorted(p.name for p in out.iterdir() if p.name != files.MANIFEST)
    assert all(files.sha256(out / name) == digest for name, digest in recorded.items())
    files.write_folder(out, eight, "samples")                     # its own files: replaced without asking
