"""imagegen-bench's options: those every mode shares at the top, each mode's in its own section (issue 53)."""
from dataclasses import fields, is_dataclass

import pytest

from commands import call, one_line_error
from imagegen.commands.bench import MODES
from imagegen.config import BenchConfig, sections

SHARED = {"mode", "overwrite", "out_dir", "arch_name", "device", "threads", "seed", "quick", "max_images",
          "eval_data", "model", "data", "train"}
# a mode's options in its section, by mode (the sampling section also times compare's and paper's samplers)
OWN = {"attention": {"lengths", "batch", "heads", "head_dim", "impls", "dtypes", "feature_maps", "repeat",
                     "cumsum_max_gb"},
       "train_step": {"batch", "lengths", "precisions", "feature_maps", "repeat"},
       "sampling": {"methods", "step_batches", "recompute_batches", "max_cache_gb", "n_positions", "probe_positions",
                    "reps", "precisions", "plot_batch", "plot_log", "lsh_options"},
       "compare": {"checkpoints", "split"}, "browser": {"batches", "steps", "rounds"},
       "paper": {"attentions", "budget", "minutes", "steps", "jobs"},
       "speedrun": {"preset", "change", "overrides", "target", "budgets", "threads", "val_every", "val_images",
                    "test_images", "record", "kept", "load"},
       "probes": {"clear"}}


def test_each_mode_has_a_section_of_its_own_options_and_the_top_holds_only_what_they_share():
    top = {f.name: f for f in fields(BenchConfig)}
    assert set(top) == SHARED | set(MODES) and set(OWN) == set(MODES)
    for mode in MODES:
        section = top[mode].default_factory()
        assert is_dataclass(section) and {f.name for f in fields(section)} == OWN[mode], mode
    assert set(sections(BenchConfig)) == set(MODES)          # each documents itself, for --help's headings


def test_help_groups_the_options_by_mode():
    out = call("imagegen-bench", "--help").stdout
    for mode in MODES:
        heading = f"\n{mode}.*: imagegen-bench mode={mode}"
        assert heading in out, mode
        block = out.split(heading, 1)[1].split("\n\n", 1)[0]
        assert all(f"  {mode}.{name}: " in block for name in OWN[mode]), mode


@pytest.mark.parametrize("old, new", [("step_batches=[1]", "sampling.step_batches"),
                                      ("sampling_precisions=[float32]", "sampling.precisions"),
                                      ("train_batch=2", "train_step.batch"),
                                      ("~train_lengths.cifar10", "train_step.lengths.cifar10"),
                                      ("attention_dtypes=[float32]", "attention.dtypes"),
                                      ("repeat=1", "attention.repeat or train_step.repeat"),
                                      ("checkpoints=[a.pt]", "compare.checkpoints"),
                                      ("browser_steps=10", "browser.steps"),
                                      ("minutes=30", "paper.minutes"), ("clear=true", "probes.clear")])
def test_an_old_flat_name_is_refused_with_its_new_place(old, new):
    name = old.lstrip("~").partition("=")[0]
    one_line_error(call("imagegen-bench", "mode=probes", old),
                   f"unknown option '{name}' (did you mean {new}?); imagegen-bench --help lists the options.")
