"""Hostile names, fuzzed (issue 54): file, folder and class names holding control characters (escape codes,
newlines, carriage returns, bidi controls), given to the writers that ask before replacing (convert, eval's
record, sample's grid and its folder, unpack) and to prepare's class table, and typed on the command line. Each
ends in its result or in one sentence, never a traceback, and no output holds a raw control character. Each run
draws fresh examples; in CI (tests/conftest.py's "ci" profile) a fixed sequence."""
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commands import call
from fixtures import tiny_checkpoint, write_class_folder
from imagegen import files
from imagegen.errors import UserError

FUZZ = settings(max_examples=20, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

CONTROLS = "\x1b\n\r\t\x07\x08\x7f\x9b\u202e\u2028"
# a file name: printable letters and control characters, no "/" or NUL, never "." or ".."
NAMES = st.text(st.sampled_from(list("ab.-_ é") + list(CONTROLS)), min_size=1, max_size=12).filter(
    lambda s: s not in (".", "..") and any(c in CONTROLS for c in s))


def clean(text):
    """No character that would act on a terminal: every one printable, or a newline between lines."""
    return all(c.isprintable() or c == "\n" for c in text)


def one_line_or_ok(proc):
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and clean(out), repr(out)
    if proc.returncode:
        assert len(proc.stderr.strip().splitlines()) == 1, repr(proc.stderr)


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ck") / "m.pt")


@FUZZ
@given(name=NAMES)
def test_a_users_file_under_a_hostile_name_is_refused_in_one_clean_sentence(ck, tmp_path_factory, name):
    folder = tmp_path_factory.mktemp("w")
    for target, write in ((folder / f"{name}.json", lambda: files.write_owned(folder / f"{name}.json", b"{}")),
                          (folder / name / "0000.png", lambda: files.write_folder(folder / name, {"0000.png": b"x"})),
                          (folder / f"{name}.safetensors",
                           lambda: files.check_owned([folder / f"{name}.safetensors"], "model"))):
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(b"mine")
        with pytest.raises(UserError) as e:
            write()
        assert clean(str(e.value)) and "\n" not in str(e.value) and target.read_bytes() == b"mine"


@settings(FUZZ, max_examples=10)
@given(name=NAMES)
def test_hostile_names_on_the_command_line_are_one_clean_sentence(ck, tmp_path_factory, name):
    folder = tmp_path_factory.mktemp("c")
    for proc in (call("imagegen-sample", f"checkpoint={ck}", f"out={folder / name}.png", "threads=1"),
                 call("imagegen-convert", f"checkpoint={ck}", f"out={folder / name}", "check_images=0", "threads=1"),
                 call("imagegen-run", "unpack", f"pack={folder / name}", f"run_dir={folder / 'r'}"),
                 call("imagegen-eval", f"checkpoint={folder / name}.pt", "threads=1")):
        assert proc.returncode
        one_line_or_ok(proc)
    assert list(folder.iterdir()) == []


@settings(FUZZ, max_examples=4)
@given(names=st.lists(NAMES, min_size=1, max_size=3, unique_by=lambda s: s.casefold()))
def test_hostile_class_folder_names_print_clean(tmp_path_factory, names):
    root = tmp_path_factory.mktemp("pics")
    try:
        write_class_folder(root, classes=names, per_class=2, size=(6, 6))
    except OSError:                     # a name this file system refuses
        return
    proc = call("imagegen-data", "prepare", "data=folder", f"data.root={root}", "data.image_size=4", "threads=1",
                "progress=false", "grid_images=0")
    one_line_or_ok(proc)
    shutil.rmtree(root, ignore_errors=True)
