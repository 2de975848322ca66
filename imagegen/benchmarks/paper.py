"""imagegen-bench mode=paper: the paper's comparison of trained attentions, from one command.

The sweep. Every attention of `paper.attentions` (softmax, linear, lsh, lsh4: the conf/model/ names) is
trained on the same data with the same architecture, seed and budget (equal minutes, or equal
steps) by `imagegen-train` in a process of its own (threads=1), as many at once as this process
has CPU cores (os.sched_getaffinity; `paper.jobs` lowers it), each in out_dir/runs/<data>-<attention>
with its output in out_dir/runs/<data>-<attention>.log. A run is finished when its last.pt holds
the budget (the trainer's own stop test, runstate.Budget); the same command again skips finished
runs and resumes the others (imagegen-train resumes from last.pt). Ctrl-C or SIGTERM is forwarded
to the training processes, which save and exit: nothing is lost. They run in sessions of their own,
so that a terminal's Ctrl-C reaches them once, through this process, and they watch this process:
killed with kill -9, it leaves no orphan training on (each stops and saves as on SIGTERM).

The table. Each run's best.pt is scored on the test split (exact bits/dim, commands/evaluate.py's
evaluate; max_images bounds it) and its sampling speed measured with its trained weights as
benchmarks/sampling.py measures it: images/sec at the best batch of its own loop (linear: the RNN;
softmax: the KV cache, and recomputation beside it; lsh: recomputation), and the seconds for one
whole image at batch 1 (timed end to end; for a recompute loop whose estimate exceeds
WHOLE_IMAGE_LIMIT_S, the estimate). A row is kept in <run>/paper-row.json for the best.pt it was
measured on and the settings it was measured with, so that the same command again measures
nothing and writes the same files. Out: paper-<data>.json and .md, and paper-<data>.png (test
bits/dim against images/sec; validation bits/dim against minutes of training).
"""
import io
import json
import os
import sys
import time
from pathlib import Path

import torch

from .. import plots
from ..config import BenchConfig, plain, typed
from ..data.sets import dataset_info, load_from_config
from ..errors import UserError
from ..files import write_bytes, write_owned
from ..paths import data_dir
from ..sampling.decode import fill_recompute
from ..store import checkpoint
from ..store.checks import architecture_diffs
from ..store.format import advice
from ..training.runstate import Budget, RunState
from .compare import current_eval
from .report import cpu_name, machine, markdown_table, write_outputs
from .sampling import measure, skip_reason, timed_positions, whole_image_seconds
from .sweep import CHILD, hydra_value, sweep

CONF_DIR = data_dir("conf")
# no time budget: the step budget of paper.budget=minutes (the minutes bind)
UNBOUNDED_STEPS = 10 ** 9
WHOLE_IMAGE_LIMIT_S = 120.0      # a recompute loop slower than this per image is estimated, not timed
# the trainer's own options that the sweep sets (the rest of the bench's train.* is passed on)
SWEEP_KEYS = ("max_steps", "max_minutes", "clock", "progress", "resume", "overwrite")
# what a run's checkpoint must agree on with the command for the sweep to resume or reuse it
ARCH_KEYS = ("n_layers", "d_model", "n_heads", "d_ff", "head", "n_mixtures", "num_classes")
# the numbers of a table row (report, plot_png); a kept row without them is measured again
# the sampling section's options that decide a row's speed (a kept row is measured again when one changes)
TIMING = ("step_batches", "recompute_batches", "n_positions", "reps", "max_cache_gb")
ROW_NUMBERS = ("steps", "train_minutes", "test_bits_per_dim", "test_images", "batch", "images_per_sec",
               "whole_image_seconds")


def model_names():
    return sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))


def check(c):
    """The paper section's options (c.paper) and max_images: one sentence naming the option and the fix."""
    names, p = model_names(), c.paper
    if not p.attentions or len(set(p.attentions)) != len(p.attentions):
        raise UserError(f"paper.attentions must list each attention once, e.g. paper.attentions=[softmax,linear], "
                        f"got {p.attentions}.")
    unknown = [a for a in p.attentions if a not in names]
    if unknown:
        raise UserError(f"unknown attention {unknown[0]!r} in paper.attentions; choose among {', '.join(names)}.")
    if p.budget not in ("minutes", "steps"):
        raise UserError(f"paper.budget must be minutes or steps, got {p.budget!r}.")
    if p.budget == "minutes" and not p.minutes > 0:
        raise UserError(f"paper.minutes must be > 0, got {p.minutes}.")
    if p.budget == "steps" and not p.steps > 0:
        raise UserError(f"paper.steps must be > 0, got {p.steps}.")
    if p.jobs < 0:
        raise UserError(f"paper.jobs must be >= 0 (0: one per CPU core), got {p.jobs}.")
    if c.max_images is not None and c.max_images <= 0:
        raise UserError(f"max_images must be a positive number or null (all), got {c.max_images}.")


def budget(c):
    """(train.max_steps, train.max_minutes) of every run."""
    p = c.paper
    return (p.steps, None) if p.budget == "steps" else (UNBOUNDED_STEPS, float(p.minutes))


def slots(c):
    """Training processes at once (each of one thread): one per CPU core this process may use, at most paper.jobs and
    at most `threads` (the cores the command was given: threads=1 keeps the whole comparison on one core)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, c.paper.jobs or cores, c.threads or cores))


def run_name(c, attention):
    return f"{c.data.name}-{attention}"


def train_args(c, attention, run_dir):
    """imagegen-train's command line for one attention: its model group, the bench's architecture,
    data and train.* (the preset's), the shared seed and budget."""
    max_steps, max_minutes = budget(c)
    data = run_data(c)
    args = [f"model={attention}"]
    if (CONF_DIR / "data" / f"{data['name']}.yaml").exists():
        args.append(f"data={data['name']}")
    if (CONF_DIR / "preset" / f"{c.arch_name}.yaml").exists():
        args.append(f"preset={c.arch_name}")                 # the record; the values below decide
    args += [f"model.{k}={hydra_value(getattr(c.model, k))}" for k in ARCH_KEYS + ("dropout",)]
    args += [f"data.{k}={hydra_value(v)}" for k, v in data.items() if k in dataset_keys()]
    args += [f"train.{k}={hydra_value(v)}" for k, v in plain(c.train).items() if k not in SWEEP_KEYS]
    args += [f"train.max_steps={max_steps}", f"train.max_minutes={hydra_value(max_minutes)}", "train.clock=cpu",
             "train.progress=false", f"run_dir={hydra_value(str(run_dir))}", f"seed={c.seed}", "threads=1",
             f"device={hydra_value(c.device)}"]
    return args


def run_data(c):
    """The data section every run trains on (a plain dict, its root absolute)."""
    return {**plain(c.data), "root": str(Path(c.data.root).expanduser().resolve())}


def check_data(c):
    """Read (or download) the runs' data once, before any run starts: a set that is missing or cannot be
    downloaded is one sentence here, not the same failure once per run, and the runs never download
    it side by side."""
    load_from_config(run_data(c), ("train", "test"))


def dataset_keys():
    from dataclasses import fields
    from ..config import DataConfig
    return {f.name for f in fields(DataConfig)}


def run_model(c, attention):
    """The model settings that `attention`'s run is trained with: the bench's architecture (ARCH_KEYS),
    and the attention and options that its conf/model/<attention>.yaml sets."""
    from omegaconf import OmegaConf
    spec = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / f"{attention}.yaml"))
    return {**{k: getattr(c.model, k) for k in ARCH_KEYS}, "attention": spec["attention"],
            "attention_options": spec.get("attention_options") or {}}


def check_run(c, attention, path, ck):
    """Refuse (one sentence) a checkpoint in `attention`'s run dir that was not trained as this
    comparison trains that attention: another attention or its options, architecture or data (a run
    copied in, or one of an earlier comparison with other settings), read from its own config."""
    diffs = architecture_diffs(ck["config"]["model"], run_model(c, attention))
    have = ck["config"]["data"].get("name")
    if have != c.data.name:
        diffs.append(f"data: {have} in checkpoint vs {c.data.name} now")
    if diffs:
        raise UserError(f"{path} is not a {attention} run of this comparison ({'; '.join(diffs)}); move its run "
                        f"folder {Path(path).parent} away (the same command then trains {attention} there afresh), "
                        f"or choose another out_dir=....")


def retrain_advice(run_dir):
    """What a damaged checkpoint of a comparison's run dir calls for (store.format.advice)."""
    return f"remove the run folder {run_dir} and run the same command again to train that row anew"


def status(c, attention, run_dir):
    """(state, last checkpoint's RunState or None): state is new, unfinished or finished. A run that
    is not this comparison's `attention` in this run dir is refused (check_run)."""
    last = Path(run_dir) / "last.pt"
    if not last.exists():
        return "new", None
    with advice(retrain_advice(run_dir)):
        ck = checkpoint.load(last)
    check_run(c, attention, last, ck)
    state = RunState.from_dict(ck["state"], ck["config"]["train"]["batch_size"])
    return ("finished" if Budget(*budget(c)).spent(state) else "unfinished"), state


def measure_speed(model, c, info):
    """Images/sec at the best batch of the model's own loop (and, for softmax, of recomputation),
    and seconds for one whole image at batch 1."""
    timing = c.sampling
    positions = timed_positions(info.length, timing.n_positions)
    attention = model.blocks[0].attn.name

    def best(sampler, batches):
        method = f"{attention}-{'recompute' if sampler == 'recompute' else 'step'}"     # skip_reason's label
        speeds = {}
        for b in batches:
            reason = skip_reason(c, c.model, info, model, method, attention, sampler, b, torch.float32)
            if reason:
                print(f"{attention}: skipping batch {b} ({reason})")
                continue
            seconds = measure(model, sampler, b, positions, timing.reps)[0]
            speeds[b] = (b / seconds, seconds / b)
        if not speeds:
            raise UserError(f"every batch size of {attention}'s {sampler} loop was skipped; add smaller "
                            f"sampling.step_batches or sampling.recompute_batches, or raise sampling.max_cache_gb.")
        batch = max(speeds, key=lambda b: speeds[b][0])
        return batch, speeds[batch][0], speeds.get(1, (None, None))[1]

    sampler = "step" if model.can_step else "recompute"
    batch, speed, estimate = best(sampler, timing.step_batches if sampler == "step" else timing.recompute_batches)
    row = {"sampler": "recurrent" if attention == "linear" else ("kv-cache" if sampler == "step" else "recompute"),
           "batch": batch, "images_per_sec": speed}
    if sampler == "step":
        row["whole_image_seconds"], row["whole_image_timed"] = whole_image_seconds(model, c.seed), True
    elif estimate is not None and estimate > WHOLE_IMAGE_LIMIT_S:
        row["whole_image_seconds"], row["whole_image_timed"] = estimate, False
    else:
        row["whole_image_seconds"], row["whole_image_timed"] = whole_recompute_seconds(model, c.seed), True
    if attention == "softmax":
        row["recompute_batch"], row["recompute_images_per_sec"], _ = best("recompute", timing.recompute_batches)
    return row


@torch.inference_mode()
def whole_recompute_seconds(model, seed=0):
    """Seconds to sample one whole image at batch 1 with the recompute loop, end to end."""
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(1, model.length, dtype=torch.uint8)
    fill_recompute(model, x, model.length - 4, 1.0, g)          # warm-up: the last 4 positions
    start = time.perf_counter()
    fill_recompute(model, x, 0, 1.0, g)
    return time.perf_counter() - start


def measured_with(c, best_path, best_ck):
    """What a kept row was measured for: the best.pt and the settings (the row is reused when equal)."""
    return {"best_mtime": best_path.stat().st_mtime, "best_step": best_ck["state"]["step"], "split": "test",
            "max_images": c.max_images, **{k: getattr(c.sampling, k) for k in TIMING}, "seed": c.seed,
            "threads": torch.get_num_threads(), "cpu": cpu_name()}


def kept_row(path, key, attention):
    """The row kept in `path` (a run's paper-row.json) when it was measured with `key` (measured_with),
    else None: none kept, measured for another best.pt or settings, or unreadable (said in one line:
    bytes that are not the JSON table_row wrote, or a row without its numbers)."""
    if not path.exists():
        return None
    try:
        kept = json.loads(path.read_bytes())
        if kept["measured_with"] != key:
            return None
        row = kept["row"]
        if row["attention"] == attention and all(isinstance(row[k], (int, float)) and not isinstance(row[k], bool)
                                                 for k in ROW_NUMBERS):
            return row
    except (OSError, ValueError, KeyError, TypeError):
        pass
    print(f"{attention}: {path} is unreadable (not the row this command wrote); measuring the row again", flush=True)
    return None


def table_row(c, attention, run_dir, state, evaluate):
    """The table's row of one finished run: kept in run_dir/paper-row.json, or measured now."""
    best_path = Path(run_dir) / "best.pt"
    if not best_path.exists():
        raise UserError(f"{run_dir} finished without a best.pt; remove that run folder and run the same "
                        f"command again.")
    with advice(retrain_advice(run_dir)):
        best_ck = checkpoint.load(best_path)
    check_run(c, attention, best_path, best_ck)
    kept_path = Path(run_dir) / "paper-row.json"
    key = measured_with(c, best_path, best_ck)
    if (kept := kept_row(kept_path, key, attention)) is not None:
        return kept
    scored = current_eval(best_path, best_ck, "test", c.max_images) or evaluate(best_path)
    model = checkpoint.model_from_checkpoint(best_ck, best_path).eval()
    info = dataset_info(best_ck["config"]["data"])
    print(f"{attention}: {scored['bits_per_dim']:.4f} test bits/dim over {scored['images']} images; timing its "
          f"sampling", flush=True)
    row = {"data": c.data.name, "attention": attention, "train_minutes": state.elapsed / 60,
           "steps": state.step, "best_step": best_ck["state"]["step"], "test_bits_per_dim": scored["bits_per_dim"],
           "test_images": scored["images"], "parameters": sum(t.numel() for t in model.parameters()),
           **measure_speed(model, c, info), "cpu": cpu_name()}
    write_bytes(kept_path, (json.dumps({"measured_with": key, "row": row}, indent=2) + "\n").encode(), "row")
    return row


def val_curve(run_dir):
    """(minutes, val bits/dim) of a run's validations, from its metrics.jsonl."""
    try:
        steps, values, minutes = plots.curve(plots.read_metrics(run_dir), "val_bpd")
    except UserError:
        return [], []
    return (minutes or []), (values if minutes else [])


def report(rows, c):
    p = c.paper
    spent = f"{p.minutes:g} minutes of training each" if p.budget == "minutes" else f"{p.steps:,} steps each"
    first = rows[0]
    header = (f"The paper's comparison on {first['data']}: {c.arch_name} architecture ({c.model.n_layers} "
              f"layers, d_model {c.model.d_model}, {c.model.n_heads} heads), seed {c.seed}, "
              f"{spent}, one thread per run; test bits/dim over {first['test_images']:,} test images (exact), "
              f"sampling with the trained weights at each loop's best batch, float32.\n"
              f"Machine: {machine()}.\n\n")
    cols = [("attention", "attention", None), ("steps", "steps", "{:,}"), ("train_minutes", "train minutes", "{:.2f}"),
            ("test_bits_per_dim", "test bits/dim", "{:.4f}"), ("sampler", "sampler", None),
            ("batch", "best batch", None), ("images_per_sec", "images/sec", "{:.4g}"),
            ("whole_image_seconds", "s per whole image (batch 1)", "{:.3g}"),
            ("recompute_images_per_sec", "softmax recompute images/sec", "{:.4g}")]
    md = header + markdown_table(rows, cols)
    estimated = [r["attention"] for r in rows if not r.get("whole_image_timed", True)]
    if estimated:
        md += (f"\n\nOne whole image of {', '.join(estimated)}: the per-position estimate (over "
               f"{WHOLE_IMAGE_LIMIT_S:g} s, so not sampled end to end).")
    return md


def plot_png(rows, curves, title):
    """PNG bytes: test bits/dim against images/sec (log x), and validation bits/dim against minutes."""
    fig, (speed_ax, curve_ax) = plots.figure(ncols=2)
    for i, row in enumerate(rows):
        colour = f"C{i % 10}"
        speed_ax.scatter([row["images_per_sec"]], [row["test_bits_per_dim"]], color=colour, s=40)
        speed_ax.annotate(row["attention"], (row["images_per_sec"], row["test_bits_per_dim"]),
                          textcoords="offset points", xytext=(5, 5), fontsize="small")
        minutes, values = curves[row["attention"]]
        if minutes:
            curve_ax.plot(minutes, values, color=colour, marker="o", ms=3, label=row["attention"])
    speed_ax.set_xscale("log")
    speed_ax.set(title=f"{title}: test bits/dim against sampling speed", xlabel="images/sec (best batch, log scale)",
                 ylabel="test bits/dim")
    curve_ax.set(title="validation bits/dim against training minutes", xlabel="minutes of training",
                 ylabel="validation bits/dim")
    if curve_ax.lines:
        curve_ax.legend(frameon=True, fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def run(c, evaluate):
    """The sweep, then the table. evaluate(path) -> imagegen-eval's result dict (bits_per_dim, images).
    Returns (payload, markdown), written to out_dir/paper-<data>.json/.md/.png. c: a BenchConfig (or a dict of one)."""
    c = typed(BenchConfig, c)
    check(c)
    out, attentions, p = Path(c.out_dir), c.paper.attentions, c.paper
    runs = {a: out / "runs" / run_name(c, a) for a in attentions}
    states = {a: status(c, a, d) for a, d in runs.items()}         # a foreign run stops us before any training
    todo = [a for a in attentions if states[a][0] != "finished"]
    n_slots = min(slots(c), max(1, len(todo)))
    done = [a for a in attentions if a not in todo]
    what = f"{p.minutes:g} minutes" if p.budget == "minutes" else f"{p.steps:,} steps"
    resuming = [a for a in todo if states[a][0] == "unfinished"]
    n = len(attentions)
    print(f"plan ({'quick' if c.quick else 'full; quick=true for a ~2-minute run'}): {n} "
          f"attention{'s' if n > 1 else ''} ({', '.join(attentions)}), {what} each, {n_slots} at a time, in "
          f"{out / 'runs'}" + (f"; finished already: {', '.join(done)}" if done else "")
          + (f"; resuming: {', '.join(resuming)}" if resuming else ""), flush=True)
    if todo:
        check_data(c)
        jobs = [(run_name(c, a), [sys.executable, "-c", CHILD, *train_args(c, a, runs[a])],
                 out / "runs" / f"{run_name(c, a)}.log") for a in todo]
        failed = sweep(jobs, n_slots)
        if failed:
            kept = [a for a in attentions if run_name(c, a) not in failed and (runs[a] / "last.pt").exists()]
            raise UserError(f"training failed for {', '.join(failed)} (their logs are in {out / 'runs'}); fix the "
                            f"cause and run the same command again"
                            + (f" ({', '.join(kept)} kept: they resume or are reused)." if kept else "."))
        states = {a: status(c, a, d) for a, d in runs.items()}
        unfinished = [a for a in attentions if states[a][0] != "finished"]
        if unfinished:
            raise UserError(f"{', '.join(unfinished)} stopped before their budget (see their logs in "
                            f"{out / 'runs'}); run the same command again to resume.")
    rows = [table_row(c, a, runs[a], states[a][1], evaluate) for a in attentions]
    curves = {a: val_curve(runs[a]) for a in attentions}
    md = report(rows, c)
    name = f"paper-{c.data.name}"
    payload = {"config": plain(c), "machine": machine(), "rows": rows,
               "curves": {a: {"minutes": m, "val_bits_per_dim": v} for a, (m, v) in curves.items()}}
    write_outputs(out, name, payload, md)
    png = out / f"{name}.png"
    write_owned(png, plot_png(rows, curves, f"{c.data.name}, {c.arch_name}"), "plot", True)     # recorded
    print(f"wrote {png}")
    return payload, md
