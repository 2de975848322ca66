"""Issue 33: what a new user hit following the README verbatim (the quick start, the Python snippet,
imagegen-convert then imagegen-export, --help), each driven as the user drives it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import imagegen
from imagegen.commands.cli import command_name
from commands import call, one_line_error, run
from fixtures import write_mnist
from imagegen.data.catalogue import DATASETS
from imagegen.model.transformer import build_model
from imagegen.store import checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = {"attention": "linear", "attention_options": {"impl": "chunked"}, "n_layers": 1, "d_model": 16,
         "n_heads": 2, "d_ff": 32, "head": "categorical", "n_mixtures": 10, "dropout": 0.0, "num_classes": 10}


def run_checkpoint(path, data_root):
    """A best.pt as imagegen-train writes it (data root absolute), of a tiny class-conditional MNIST model."""
    torch.manual_seed(0)
    model = build_model(MODEL, DATASETS["mnist"])
    config = {"model": MODEL, "data": {"name": "mnist", "root": str(data_root), "download": False, "mirror": None,
                                       "val_fraction": 0.05, "split_seed": 0}, "train": {"lr": 1e-3}}
    checkpoint.save(path, {"config": config, "model": model.state_dict(),
                           "state": {"step": 7, "elapsed": 90.0, "epoch": 0, "seen": 0, "best_val": 5.0}})
    return path


# ---------------------------------------------------------------- 1. imagegen-convert, then imagegen-export
def test_readme_convert_then_export_finds_the_data_away_from_data_mnist(tmp_path, mnist_root, monkeypatch):
    """The README's convert and export lines in a folder without ./data/mnist: the run's data root is
    kept (data.root null keeps the checkpoint's), so the check scores and the site has its examples."""
    ck = run_checkpoint(tmp_path / "run" / "best.pt", mnist_root)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    proc = call("imagegen-convert", f"checkpoint={ck}", "out=my-digits", "check_images=4", "progress=false",
                "threads=1")
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((work / "my-digits.json").read_text())
    assert meta["config"]["data"]["root"] == str(mnist_root) and meta["record"]["test_check"]["images"] == 4
    proc = call("imagegen-export", "checkpoint=my-digits.safetensors", "out=site", "threads=1")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "no test images" not in proc.stdout
    config = json.loads((work / "site" / "config.json").read_text())
    assert config["examples"] == 8 and len(config["example_labels"]) == 8
    assert (work / "site" / "examples.bin").stat().st_size == 8 * 784


def test_convert_records_a_relative_root_absolute_and_none_for_a_model_to_ship(tmp_path, mnist_root, monkeypatch):
    ck = run_checkpoint(tmp_path / "run" / "best.pt", tmp_path / "moved")      # the run's data has moved since
    monkeypatch.chdir(mnist_root.parent)
    proc = call("imagegen-convert", f"checkpoint={ck}", f"out={tmp_path / 'a'}", "check_images=2", "progress=false",
                f"data.root={mnist_root.name}", "threads=1")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "a.json").read_text())["config"]["data"]["root"] == str(mnist_root)
    proc = call("imagegen-convert", f"checkpoint={ck}", f"out={tmp_path / 'b'}", "check_images=2", "progress=false",
                f"data.root={mnist_root}", "keep_root=false", "threads=1")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "b.json").read_text())["config"]["data"]["root"] is None


def test_a_failed_convert_leaves_nothing_behind(tmp_path, mnist_root, monkeypatch):
    ck = run_checkpoint(tmp_path / "run" / "best.pt", mnist_root)
    monkeypatch.chdir(tmp_path)
    proc = call("imagegen-convert", f"checkpoint={ck}", "out=my-digits", "check_images=4", "progress=false",
                f"data.root={tmp_path / 'nowhere'}", "threads=1")
    assert proc.returncode == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


# ---------------------------------------------------------------- 2. the kernel's fallback notice
@pytest.mark.slow
def test_sample_without_a_built_kernel_says_so_in_one_clean_line(tmp_path):
    """The quick start's first command with no kernel built yet (imagegen-sample never compiles it):
    the fallback is one line on stderr, not a RuntimeWarning followed by a line of our source."""
    proc = run("imagegen-sample", "num_images=2", "nrow=2", "label=3", "threads=1", "progress=false",
               f"out={tmp_path / 'x.png'}", env={"TORCH_EXTENSIONS_DIR": str(tmp_path / "no-build")})
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    notice = [ln for ln in lines if "falling back" in ln]
    assert len(notice) == 1, proc.stderr
    assert notice[0].startswith("imagegen: causal product kernel unavailable on cpu (not built yet"), notice[0]
    assert "python -m imagegen.ops`" in notice[0] and notice[0].endswith("chunked PyTorch form.")
    assert not any("Warning" in ln or "warnings.warn" in ln or "BlockState" in ln or ".py:" in ln for ln in lines), \
        proc.stderr


def test_the_fallback_line_starts_a_line_of_its_own_under_a_progress_bar(tmp_path, monkeypatch):
    """imagegen-sample in this process with no kernel built (an empty extension root): the line is said from
    inside the sampling loop, whose bar it followed on the same line ("... 0/28 [00:00<?, ?row/s]imagegen: ...");
    the bar is now cleared first. Shown as Python shows a warning by default (pytest records them instead)."""
    import warnings
    from imagegen.ops import build as kernel
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "no-build"))
    monkeypatch.setattr(kernel, "_modules", {})
    monkeypatch.setattr(kernel, "_warned", set())
    monkeypatch.setattr(warnings, "showwarning", lambda message, category, filename, lineno, file=None, line=None:
                        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line)))
    proc = call("imagegen-sample", "num_images=2", "nrow=2", "label=3", "threads=1", "progress=true",
                "precision=float32", f"out={tmp_path / 'x.png'}")
    assert proc.returncode == 0, proc.stderr
    notice = [ln for ln in proc.stderr.split("\n") if "falling back" in ln]
    assert len(notice) == 1 and "sampling" in proc.stderr, proc.stderr       # the bar was drawn
    assert notice[0].split("\r")[-1].startswith("imagegen: causal product kernel unavailable on cpu (not built yet")


def test_the_fallback_warning_is_still_a_runtime_warning(monkeypatch):
    from imagegen.ops import build as kernel
    monkeypatch.setattr(kernel, "_warned", set())
    with pytest.warns(RuntimeWarning, match="no compiler.*chunked"):
        kernel.warn_fallback("causal product kernel", "cpu", "no compiler\nhere")


# ---------------------------------------------------------------- 3. and 4. the README's quick start
README = Path(__file__).resolve().parents[1] / "README.md"


def readme_block(after, language):
    """The first ```language block of README.md after the line `after`."""
    text = README.read_text()
    start = text.index(f"```{language}\n", text.index(after)) + len(language) + 4
    return text[start:text.index("```", start)]


def test_load_split_gives_images_and_labels_as_the_api_takes_them(tmp_path, monkeypatch):
    out = write_mnist(tmp_path / "mnist")
    monkeypatch.setenv("IMAGEGEN_DATA", str(tmp_path))              # the shipped model's data root is empty
    model = imagegen.load("mnist-linear")
    images, labels = model.load_split("test", n=5)
    assert images.shape == (5, 28, 28, 1) and images.dtype == np.uint8 and labels.dtype == np.int64
    assert np.array_equal(images[..., 0], out["t10k"][0][:5]) and np.array_equal(labels, out["t10k"][1][:5])
    images, labels = model.load_split("test", root=str(tmp_path / "mnist"))
    assert len(images) == len(labels) == 16


@pytest.mark.slow
def test_the_readme_python_snippet_runs_as_written(tmp_path):
    """The snippet under "From Python:", verbatim, in a fresh interpreter, with the fixture's MNIST where
    the shipped model looks for its data ($IMAGEGEN_DATA/mnist)."""
    write_mnist(tmp_path / "data" / "mnist")
    snippet = readme_block("From Python:", "python")
    assert "load_split" in snippet
    env = {**os.environ, "IMAGEGEN_DATA": str(tmp_path / "data"), "OMP_NUM_THREADS": "1",
           "IMAGEGEN_DISABLE_KERNEL": "1"}                       # no minute-long compile inside the test
    proc = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]                  # run as a script, it prints what it measured
    assert last.startswith("bits/dim: ") and 0 < float(last.split()[-1]) < 8, proc.stdout
    assert (tmp_path / "sevens-python.png").is_file() and (tmp_path / "halves-python.png").is_file()


def test_quick_start_commands_each_write_their_own_file_and_pass_no_default_guidance():
    from imagegen.store import shipped
    default = json.loads((shipped.SHIPPED / f"{shipped.DEFAULT}.json").read_text())["record"]["guidance"]
    block = readme_block("Draw digits with the model that ships", "bash")
    commands = [line.split("#")[0].split() for line in block.splitlines() if line.startswith("imagegen-sample")]
    assert len(commands) == 3
    outs = [dict(a.split("=", 1) for a in c[1:]).get("out") for c in commands]
    assert None not in outs and len(set(outs)) == 3, outs
    for c in commands:
        guidance = dict(a.split("=", 1) for a in c[1:]).get("guidance")
        assert guidance is None or float(guidance) != default, c


# ---------------------------------------------------------------- 5. --help and typos
@pytest.mark.parametrize("name", ["train", "eval", "sample", "bench", "export", "convert"])
def test_threads_help_says_what_0_does_for_each_command(name):
    out = call(*command_name(name).split(), "--help").stdout
    text = out.split("  threads: int = 0\n", 1)[1].splitlines()[0].strip()
    assert text != "CPU threads for torch (0: torch's default)", name
    if name == "sample":
        assert "0: measured" in text and "1 thread" in text


def test_help_shows_the_values_of_the_preset_on_the_command_line():
    plain = call("imagegen-train", "--help").stdout
    preset = call("imagegen-train", "preset=cpu_mnist", "--help").stdout
    assert "  train.lr: float = 0.002\n" in plain and "  model.num_classes: int = 0\n" in plain
    assert "  train.lr: float = 0.008\n" in preset and "  model.num_classes: int = 10\n" in preset
    assert "default with preset=cpu_mnist" in preset
    one_line_error(call("imagegen-train", "preset=nope", "--help"), "unknown preset 'nope'")


@pytest.mark.parametrize("typo,option", [("trian.max_steps", "train.max_steps"), ("modle.n_layers", "model.n_layers"),
                                         ("lable", "label")])
def test_a_typo_in_a_dotted_key_gets_a_suggestion(typo, option):
    cmd = "imagegen-sample" if typo == "lable" else "imagegen-train"
    one_line_error(call(cmd, f"{typo}=3"), f"unknown option '{typo}' (did you mean {option}?)")


# ---------------------------------------------------------------- 6. the demo page


@pytest.mark.slow
def test_page_opens_on_a_row_per_class_and_a_picked_test_image_brings_its_class(browser, tmp_path, mnist_root):
    from imagegen.benchmarks.browser import serve
    from imagegen.commands.export import export

    ck = run_checkpoint(tmp_path / "run" / "best.pt", mnist_root)
    export({"checkpoint": str(ck), "out": str(tmp_path / "site"), "examples": 4, "data": {"root": None},
            "guidance": 3.0})
    labels = json.loads((tmp_path / "site" / "config.json").read_text())["example_labels"]
    assert labels == write_mnist(tmp_path / "again")["t10k"][1][:4].tolist()
    with serve(tmp_path / "site") as url:
        page = browser.new_page()
        page.goto(url + "?autostart=0")
        page.wait_for_function("window.imagegen && window.imagegen.status === 'ready'", timeout=30_000)
        assert page.input_value("#label") == "rows" and page.is_enabled("#guidance")
        assert page.input_value("#guidance") == "3"
        page.fill("#n", "10")                                  # one image of each class, its name left of its row
        page.click("#go")
        page.wait_for_function("window.imagegen.status === 'done'", timeout=120_000)
        names = page.evaluate("Array.from(document.querySelectorAll('#rowNames div'), d => d.textContent)")
        assert names == [str(c) for c in range(10)] and page.is_visible("#rowNames")

        page.check("input[value=complete]")
        other = next(str(y) for y in range(10) if y != labels[1])
        page.select_option("#label", other)                    # a class chosen before picking a test image
        page.locator("#examples canvas").nth(1).click()
        assert page.input_value("#label") == str(labels[1]) and page.is_enabled("#guidance")
        pad = page.evaluate("Array.from(document.getElementById('pad').getContext('2d')"
                            ".getImageData(0, 0, 28, 14).data.filter((_, i) => i % 4 === 0))")
        example = np.frombuffer((tmp_path / "site" / "examples.bin").read_bytes(), np.uint8)[784:784 + 392]
        assert pad == example.tolist()

        page.goto(url + "?mode=complete&autostart=0")        # opened on completion: the first test image's class
        page.wait_for_function("window.imagegen && window.imagegen.status === 'ready'", timeout=30_000)
        assert page.input_value("#label") == str(labels[0])
        page.close()
