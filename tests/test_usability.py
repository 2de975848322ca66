"""What a new user meets: help that explains every option, an honest progress bar, outputs in
predictable places."""
import re

import pytest

from imagegen.commands.cli import command_name
from imagegen.config import SCHEMAS, describe
from imagegen.errors import UserError
from imagegen.training.runstate import Budget, RunState
from commands import TINY, call, one_line_error, run


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_help_describes_every_option(name):
    out = call(*command_name(name).split(), "--help").stdout        # imagegen-data prepare: a command and a verb
    assert out.startswith(f"{command_name(name)}: ")
    for key, kind, text in describe(SCHEMAS[name]):
        assert text, f"{name}: {key} has no help sentence"
        assert (f"  {key}: {kind} = " in out or f"  {key}: {kind}, required (e.g. {key}=" in out) and text in out, key
    assert "examples:" in out and "???" not in out and "unused" not in out


def test_required_options_show_as_required_with_an_example():
    out = call("imagegen-convert", "--help").stdout
    assert "  checkpoint: str, required (e.g. checkpoint=checkpoints/run/best.pt)\n" in out
    assert "  out: str, required (e.g. out=checkpoints/my-model)\n" in out


@pytest.mark.parametrize("cmd, key", [(["imagegen-data", "prepare"], "device=cpu"), (["imagegen-plot"], "threads=1"),
                                      (["imagegen-plot"], "device=cpu")])
def test_commands_without_a_model_refuse_device_and_threads(cmd, key):
    """imagegen-data prepare listed device and threads as "unused", and took them silently (its threads= now sets
    its converting processes, issue 54)."""
    one_line_error(call(*cmd, key), f"{' '.join(cmd)} takes no {key.split('=')[0]}=...: it runs no model")


def test_overwrite_help_names_the_folder_the_old_run_goes_to(tmp_path):
    from imagegen.training.rundir import set_aside
    (tmp_path / "last.pt").write_bytes(b"old")
    folder = set_aside(tmp_path, [tmp_path / "last.pt"])
    prefix = folder.name.split("-")[0]                  # previous-20261128-001500 -> previous
    out = call("imagegen-train", "--help").stdout
    assert f"run_dir/{prefix}-<time>/" in out.split("train.overwrite:")[1].split("\n  train.")[0]


def test_sample_help_says_a_grid_of_a_conditional_model_has_a_row_per_class():
    mode = call("imagegen-sample", "--help").stdout.split("  mode: str = grid\n")[1].splitlines()[0]
    assert "unconditional" not in mode and "a row per class" in mode


def test_export_takes_what_its_help_says_a_shipped_name_and_a_safetensors_model(tmp_path):
    from imagegen.commands.export import export
    out = call("imagegen-export", "--help").stdout.split("  checkpoint: str")[1].splitlines()[1]
    assert ".safetensors" in out and "shipped model" in out
    written = export({"checkpoint": "mnist-linear", "out": str(tmp_path / "site"), "examples": 0,
                      "data": {"root": None}})
    assert "model.safetensors" in written


def test_commands_take_only_their_config_groups():
    out = call("imagegen-sample", "--help").stdout
    assert "config groups" not in out and "preset" not in out
    one_line_error(call("imagegen-eval", "preset=small"), "imagegen-eval takes no preset=...")


def test_progress_total_follows_the_time_budget():
    budget = Budget(max_steps=100_000, max_minutes=4)
    state = RunState(step=156, elapsed=120.0)
    assert budget.expected_total(state, seconds_per_step=1.0) == 156 + 120     # 2 minutes left at 1 s/step
    assert Budget(200, 4).expected_total(state, 1.0) == 200                   # the step budget binds first
    assert Budget(300, None).expected_total(state, 1.0) == 300


@pytest.mark.slow
def test_progress_bar_under_a_minute_budget(mnist_root, tmp_path):
    proc = run("imagegen-train", "model=linear", f"data.root={mnist_root}", f"run_dir={tmp_path}", *TINY[:-1],
               "train.max_minutes=0.05", "train.val_every=100000", "train.sample_every=0", "train.progress=true")
    totals = [int(t) for t in re.findall(r"\d+/(\d+) \[", proc.stderr)]
    assert totals and totals[-1] < 100_000 and totals[-1] == int(re.findall(r"(\d+)/\d+ \[", proc.stderr)[-1])


def test_sample_writes_beside_the_checkpoint_by_default(tmp_path):
    from fixtures import tiny_checkpoint
    path = tiny_checkpoint(tmp_path / "best.pt")
    proc = call("imagegen-sample", f"checkpoint={path}", "num_images=2", "progress=false")
    assert (tmp_path / "best-grid.png").exists() and f"wrote {tmp_path / 'best-grid.png'}" in proc.stdout


@pytest.mark.parametrize("name,typo,option", [("train", "train.max_minuts", "train.max_minutes"),
                                              ("sample", "lable", "label"), ("eval", "splt", "split")])
def test_a_typo_gets_the_closest_option(name, typo, option):
    from imagegen import config
    from imagegen.commands.cli import compose
    config.register()                     # what each command's main() does first
    with pytest.raises(UserError, match=f"did you mean {option}\\?"):
        compose(name, [f"{typo}=1"])


def test_no_suggestion_for_a_key_like_no_option():
    from imagegen.commands.cli import did_you_mean
    assert did_you_mean("train", "completely.different") == ""


@pytest.mark.slow
def test_help_does_not_import_torch():
    """--help answers from the typed configs (a second), not after torch's import (several)."""
    import subprocess
    import sys
    code = ("import sys\nfrom imagegen.commands import scripts\n"
            "for name in ('train', 'eval', 'sample', 'bench', 'plot', 'export', 'convert'):\n"
            "    sys.argv = ['imagegen-' + name, '--help']\n    getattr(scripts, name)()\n"
            "print('torch imported:', 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.count("options (key: type = default; meaning):") == 7
    assert out.strip().endswith("torch imported: False")
