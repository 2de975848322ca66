"""A benchmark as a user meets it: the plan first, then a line per measured case with an estimate of
the time left, and the table and JSON rewritten after every row, so that a run stopped early keeps
what it measured (its JSON says "partial": true until the last row). `quick=true` swaps in
settings that finish in about a minute on 2 cores (QUICK)."""
import time

from ..config import BenchConfig, plain, typed
from .report import write_outputs

# per mode, the settings quick=true overrides, by section (the architecture is the preset's)
QUICK = {
    "attention": {"attention": {"lengths": [784, 3072], "impls": ["softmax", "chunked", "kernel", "auto"],
                                "repeat": 1}},
    "train_step": {"train_step": {"batch": 2, "repeat": 1, "precisions": ["float32"]}},
    "sampling": {"sampling": {"methods": ["linear-recurrent", "softmax-kv-cache"], "step_batches": [1, 16],
                              "n_positions": 3, "reps": 2, "probe_positions": [], "precisions": ["float32"]}},
    # a tiny model, a few steps each, a small test subset: the whole pipeline in about two minutes
    "paper": {"paper": {"budget": "steps", "steps": 32}, "max_images": 32,
              "sampling": {"step_batches": [1, 8], "recompute_batches": [1], "n_positions": 3, "reps": 1},
              "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_ff": 32, "head": "categorical", "n_mixtures": 2},
              "train": {"batch_size": 4, "lr": 2.0e-3, "warmup_steps": 2, "val_every": 8, "val_images": 16,
                        "save_every": 4, "log_every": 2, "sample_every": 0, "sample_minutes": 0.0,
                        "tensorboard": False}},
}


def apply_quick(c):
    """c (a BenchConfig, or a dict of one) as a BenchConfig with QUICK's settings for its mode when c.quick is true,
    each section's merged into it (train_step: only the data's own length); c itself is left alone."""
    from omegaconf import OmegaConf

    c = typed(BenchConfig, c)
    if not c.quick:
        return c
    c = typed(BenchConfig, OmegaConf.merge(plain(c), QUICK.get(c.mode, {})))
    if c.mode == "train_step":
        name, lengths = c.data.name, c.train_step.lengths
        c.train_step.lengths = {name: lengths[name]} if name in lengths else lengths
    return c


class Progress:
    """Announces `cases` (a list of short strings) and, for each `row(...)`, prints it with the time
    left and rewrites out_dir/name.json and .md through render(rows) -> (payload dict, markdown)."""

    def __init__(self, out_dir, name, cases, render, quick=False):
        self.out_dir, self.name, self.cases, self.render = out_dir, name, list(cases), render
        self.rows, self.done, self.start = [], 0, time.perf_counter()
        print(f"plan ({'quick' if quick else 'full; quick=true for a ~1-minute run'}): {len(self.cases)} cases: "
              f"{', '.join(self.cases)}; rows go to {out_dir}/{name}.json and .md as they are measured",
              flush=True)

    def row(self, row, line=None):
        """Record one result row (a dict) of the next case; line: what to print (default: the case)."""
        self.rows.append(row)
        self.case_done(line)
        self.write(partial=True, quiet=True)

    def case_done(self, line=None):
        self.done += 1
        elapsed = time.perf_counter() - self.start
        left = elapsed / self.done * (len(self.cases) - self.done)
        case = self.cases[self.done - 1] if self.done <= len(self.cases) else "?"
        print(f"[{self.done}/{len(self.cases)} {elapsed:.0f} s, about {left:.0f} s left] {line or case}", flush=True)

    def write(self, partial=False, quiet=False):
        payload, md = self.render(self.rows)
        write_outputs(self.out_dir, self.name, {"partial": partial, **payload}, md, quiet=quiet)
        return payload, md
