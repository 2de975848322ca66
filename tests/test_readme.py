"""The README is executable (DESIGN.md): every command of its ```bash blocks, and its ```python snippet, run as
written from a fresh copy of the repository (its git-tracked files in tmp_path; the package itself is this
checkout's), with the standard sets given by $IMAGEGEN_DATA as small fixture files and ~ a home of the test's
own (holding the ~/pictures the README trains on). A command that fails fails the test, naming its line.

What is left out or changed, each on purpose: pip lines (the environment has the package); `export
IMAGEGEN_DATA=...` (the test sets it); the suite's own pytest lines (this file is part of the suite); a server
(`python -m http.server -d DIR`) is replaced by a check that DIR was written. Commands run in this process
(tests/commands.call), at smaller sizes by the overrides in SMALLER (a tiny model, 2 training steps, a few
images), with threads=1; the README's placeholder N (classes) becomes the fixture's 2. A line that no rule
here knows fails the test, so that a new kind of README command is taken in, not skipped."""
import contextlib
import io
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commands import call
from fixtures import write_cifar, write_class_folder, write_mnist

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TINY_MODEL = ["model.n_layers=1", "model.d_model=16", "model.n_heads=2", "model.d_ff=32"]
SMALLER = {   # command -> overrides that replace (or add to) the README's own, keeping what it shows
    "imagegen-train": [*TINY_MODEL, "train.batch_size=4", "train.max_steps=2", "train.val_every=2",
                       "train.val_images=4", "train.progress=false", "threads=1"],
    "imagegen-sample": ["num_images=2", "nrow=1", "num_originals=1", "completions=1", "progress=false", "threads=1"],
    "imagegen-eval": ["max_images=4", "progress=false", "threads=1"],
    "imagegen-convert": ["check_images=2", "progress=false", "threads=1"],
    "imagegen-export": ["examples=2", "threads=1"],
    "imagegen-data": ["grid_images=4", "progress=false"],
}
PLACEHOLDERS = {"model.num_classes=N": "model.num_classes=2"}     # write_class_folder's cat and dog


def blocks(language):
    """The README's ```language blocks, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.S | re.M)


def commands(block):
    """The commands of a bash block: comments dropped, continued lines joined, `a && b` as two."""
    text = re.sub(r"\\\n", " ", block)
    out = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            out.append(words[:cut])
            words = words[cut + 1:]
    return out


def smaller(words):
    """words with SMALLER's overrides for its command: a key the README sets is replaced, others appended."""
    extra = SMALLER.get(words[0], [])
    keys = {a.partition("=")[0] for a in extra}
    return [PLACEHOLDERS.get(w, w) for w in words if w.partition("=")[0] not in keys] + extra


def run_line(words):
    """Run one README command in this process; returns (what ran, exit status, output)."""
    if words[0].startswith("imagegen-"):
        args = smaller(words)
        proc = call(*args)
        pictures = [a.partition("=")[2] for a in args if a.startswith("out=") and a.endswith(".png")]
        missing = [] if proc.returncode else [p for p in pictures if not Path(p).is_file()]
        said = proc.stdout + proc.stderr + (f"wrote no {', '.join(missing)}" if missing else "")
        return args, proc.returncode or int(bool(missing)), said
    if words[:3] == ["python", "-m", "imagegen.ops"]:
        return words, *run_module("imagegen.ops", words[3:])
    if words[:3] == ["python", "-m", "http.server"]:
        folder = words[words.index("-d") + 1]
        return words, 0 if (Path(folder) / "index.html").is_file() else 1, f"no site in {folder}"
    if words[0] == "ruff":
        exe = shutil.which("ruff") or shutil.which("ruff", path=os.path.dirname(sys.executable))
        if exe is None:
            return words, 0, "ruff is not installed here (pip install -e '.[dev]' installs it)"
        proc = subprocess.run([exe, *words[1:]], capture_output=True, text=True, timeout=120)
        return words, proc.returncode, proc.stdout + proc.stderr
    raise AssertionError(f"README.md: no rule in tests/test_readme.py runs {' '.join(words)!r}")


def skipped(words):
    return (words[0] == "pip" or words[:3] == ["python", "-m", "pytest"]
            or (words[0] == "export" and words[1].startswith("IMAGEGEN_DATA=")))


def run_module(name, argv):
    """`python -m name argv` in this process -> (exit status, output)."""
    out, saved = io.StringIO(), sys.argv
    sys.argv = [name, *argv]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_module(name, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
        out.write(f"{e.code}\n" if isinstance(e.code, str) else "")
    finally:
        sys.argv = saved
    return code, out.getvalue()


@pytest.fixture
def fresh_copy(tmp_path, monkeypatch):
    """The repository's tracked (and new, not ignored) files copied into tmp_path/repo, the current folder;
    $IMAGEGEN_DATA holds fixture MNIST and CIFAR-10, and ~ is tmp_path/home with a ~/pictures of two classes."""
    from torch.utils.cpp_extension import get_default_build_root
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    repo = tmp_path / "repo"
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    data = tmp_path / "data"
    write_mnist(data / "mnist")
    write_cifar(data / "cifar10")
    write_class_folder(tmp_path / "home" / "pictures", per_class=4)
    # the kernel's build stays where it is (torch's default root follows ~), and nothing reaches a network
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("IMAGEGEN_DATA", str(data))
    monkeypatch.chdir(repo)
    return repo


RUN = [[words for words in commands(block) if not skipped(words)] for block in blocks("bash")]


@pytest.mark.slow
@pytest.mark.parametrize("lines", [lines for lines in RUN if lines], ids=lambda lines: " ".join(lines[0][:3]))
def test_each_bash_block_runs_from_a_fresh_copy(fresh_copy, lines):
    for words in lines:
        args, code, output = run_line(words)
        assert code == 0, f"README.md's {' '.join(words)!r} (run as {' '.join(args)!r}) failed:\n{output}"


@pytest.mark.slow
def test_the_python_snippet_runs_from_a_fresh_copy(fresh_copy):
    (snippet,) = blocks("python")
    exec(compile(snippet, str(README), "exec"), {"__name__": "__main__"})
    written = re.findall(r"\.save\(\"([^\"]+)\"\)", snippet)
    assert written and all((fresh_copy / name).is_file() for name in written)


def test_every_block_has_a_rule():
    """The parsing itself: each README command is run or knowingly skipped, the chained export and its
    server split in two, and the README's placeholders known."""
    lines = [words for block in blocks("bash") for words in commands(block)]
    assert ["python", "-m", "http.server", "-d", "site", "8000"] in lines
    assert any(w[0] == "imagegen-train" for w in lines) and any(w[0] == "imagegen-data" for w in lines)
    for words in lines:
        assert skipped(words) or words[0].startswith("imagegen-") or words[0] == "ruff" or words[:2] == ["python", "-m"]
        assert not any(re.fullmatch(r"[\w.]+=[A-Z]", w) and w not in PLACEHOLDERS for w in words), words
