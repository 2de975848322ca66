"""imagegen-bench mode=speedrun: the time a training recipe takes to a fixed validation target.

A run is `imagegen-train preset=P` with the change's overrides, in a process of its own at `threads`
(the record: 1), with train.clock=cpu and train.max_minutes=B, so that the cosine schedule spans B
minutes of this process's CPU time, and train.target_bpd=target, so that it stops at the first
validation at or under the target. Validation is the fixed held-out set (the seeded 5% of the training
files that is never trained on): its first 2,000 images for MNIST, 1,000 for CIFAR-10. Time to target is
the run's training CPU time at that validation (validation, saving and the kernel build not counted).
The record of a recipe is the smallest budget whose run gets there: `budgets` are tried in order and the
first run that reaches the target ends the list.

Each run adds one row to `record` (JSON; keys data, preset, change, target, cpu_seconds, wall_seconds,
threads, steps, cpu, kept and the rest below) and the record table beside it (.md) is written anew from
all rows. A finished run is not trained again: the same command re-reads it.
"""
import json
import sys
import time
from datetime import date
from pathlib import Path

import torch

from ..attention.linear import LinearAttention
from ..bits_per_dim import bits_per_dim
from ..config import BenchConfig, plain, typed
from ..data.sets import dataset_info, load_from_config
from ..errors import UserError
from ..files import folder_turn, write_bytes
from ..store import checkpoint
from ..tuning.machine import cpu_name
from .sweep import CHILD, hydra_value, sweep
from .report import markdown_table

TARGETS = {"mnist": 1.00, "cifar10": 4.50}         # the targets, validation bits/dim
VAL_IMAGES = {"mnist": 2000, "cifar10": 1000}
PEAK_SIZE = 1024                                    # the square product timed for the core's peak


def check(s, data_name):
    if not s.budgets or any(not b > 0 for b in s.budgets):
        raise UserError(f"speedrun.budgets must list positive minutes, e.g. [4,6,8], got {s.budgets}.")
    if s.target is None and data_name not in TARGETS:
        raise UserError(f"there is no default target for data={data_name}; pass speedrun.target=BITS_PER_DIM.")
    if s.threads < 1:
        raise UserError(f"speedrun.threads must be >= 1 (the record is timed at 1), got {s.threads}.")


def slug(text):
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[:60] or "run"


def train_argv(s, data, target, budget, seed, run_dir):
    """imagegen-train's command line for one run of the speedrun."""
    return [sys.executable, "-c", CHILD, f"preset={s.preset}", f"data={data.name}",
            f"data.root={hydra_value(data.root)}", *s.overrides, f"threads={s.threads}",
            "train.clock=cpu", f"train.max_minutes={budget!r}", f"train.target_bpd={target!r}",
            f"train.val_images={s.val_images or VAL_IMAGES.get(data.name, 1000)}",
            f"train.val_every={s.val_every}", "train.sample_every=0", "train.sample_minutes=0",
            "train.progress=false", f"seed={seed}", f"run_dir={hydra_value(str(run_dir))}"]


def metrics(run_dir):
    rows = []
    path = Path(run_dir) / "metrics.jsonl"
    if path.exists():
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def time_to_target(rows, target):
    """(step, cpu seconds, wall seconds, best val) at the first validation at or under target (None for the
    first three when none is), from a run's metrics rows."""
    vals = [r for r in rows if "val_bpd" in r]
    best = min((r["val_bpd"] for r in vals), default=None)
    for r in vals:
        if r["val_bpd"] <= target:
            return r["step"], r["elapsed"], r.get("wall"), best
    return None, None, None, best


def useful_flops_per_token(model):
    """6 x the non-embedding parameters (forward and backward) plus the linear attention's state work:
    per head and position 2 E M multiply-adds forward to update S and read it, three times that with
    the backward, so 12 E M FLOPs (softmax's and LSH's quadratic work is not counted)."""
    params = sum(p.numel() for n, p in model.named_parameters() if n.startswith(("blocks.", "ln_f.", "proj.")))
    attention = sum(12 * b.attn.n_heads * b.attn.head_dim ** 2 for b in model.blocks
                    if isinstance(b.attn, LinearAttention))
    return 6 * params + attention


def core_peaks():
    """{float32, bfloat16: GFLOP/s} of one thread's best square product (PEAK_SIZE) of 20, the core's practical
    peak (measured once per CPU model, kept in the record: delete its entry there to measure it again)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {}
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.randn(PEAK_SIZE, PEAK_SIZE, dtype=dtype), torch.randn(PEAK_SIZE, PEAK_SIZE, dtype=dtype)
            best = float("inf")
            for _ in range(20):
                start = time.perf_counter()
                torch.mm(a, b)
                best = min(best, time.perf_counter() - start)
            out[str(dtype).removeprefix("torch.")] = 2 * PEAK_SIZE ** 3 / best / 1e9
        return out
    finally:
        torch.set_num_threads(threads)


def test_bpd(run_dir, data, n):
    """Exact bits/dim of the run's best.pt over the first n test images (None: n is 0 or no best.pt)."""
    best = Path(run_dir) / "best.pt"
    if not n or not best.exists():
        return None
    ck = checkpoint.load(best)
    model = checkpoint.model_from_checkpoint(ck, best)
    (x, y), = load_from_config(data, ("test",), labels=True)
    return bits_per_dim(model, x[:n], 32, torch.device("cpu"), labels=y[:n] if model.num_classes else None)


def row_of(s, c, data, target, budget, run_dir):
    rows = metrics(run_dir)
    step, cpu_s, wall_s, best = time_to_target(rows, target)
    ck = checkpoint.load(Path(run_dir) / "last.pt")
    model = checkpoint.model_from_checkpoint(ck)
    steps, elapsed, wall = ck["state"]["step"], ck["state"]["elapsed"], ck["state"].get("wall") or None
    batch, length = ck["config"]["train"]["batch_size"], dataset_info(plain(data)).length
    tokens_per_s = steps * batch * length / wall if wall else None          # at the run's threads
    flops = useful_flops_per_token(model)
    rate = flops * steps * batch * length / elapsed / 1e9 if elapsed else None   # per CPU-second: one core's
    return {"data": data.name, "preset": s.preset, "change": s.change, "overrides": list(s.overrides),
            "target": target, "budget_minutes": budget, "reached": step is not None,
            "cpu_seconds": cpu_s, "wall_seconds": wall_s, "steps": step, "threads": s.threads,
            "run_steps": steps, "run_cpu_seconds": elapsed, "best_val_bpd": best, "tokens_per_s": tokens_per_s,
            "useful_gflops": rate, "flops_per_token": flops,
            "test_bpd": test_bpd(run_dir, {**ck["config"]["data"], "root": data.root}, s.test_images),
            "test_images": s.test_images, "precision": ck.get("precision"), "seed": c.seed,
            "cpu": cpu_name(), "date": date.today().isoformat(), "kept": s.kept, "load": s.load,
            "run_dir": str(run_dir)}


def read_record(path):
    if not Path(path).exists():
        return {"peaks": {}, "rows": []}
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is not a speedrun record ({e}); move it aside or pass "
                        f"speedrun.record=OTHER.json.") from None
    if not (isinstance(record, dict) and isinstance(record.get("rows"), list)):
        raise UserError(f"{path} is not a speedrun record (no list of rows); move it aside or pass "
                        f"speedrun.record=OTHER.json.")
    return record


def minutes(seconds):
    return None if seconds is None else seconds / 60


def shares(rate, peaks):
    """{share, share_bf16}: the useful rate as a percentage of the CPU's measured peaks (None where unknown,
    and for bfloat16 where its peak is below float32's: emulated)."""
    if not rate or not peaks:
        return {"share": None, "share_bf16": None}
    bf16 = 100 * rate / peaks["bfloat16"] if peaks["bfloat16"] > peaks["float32"] else None
    return {"share": 100 * rate / peaks["float32"], "share_bf16": bf16}


def table(record):
    """The record table: every run, in the order tried, its time to target beside the record before it on the
    same CPU model (CPU-minutes of different cores do not compare)."""
    rows, best = [], {}
    for r in record["rows"]:
        key = (r["data"], r["target"], r["threads"], r["cpu"])
        before = best.get(key)
        rows.append({**r, "minutes": minutes(r["cpu_seconds"]), "record_before": minutes(before),
                     "verdict": {True: "kept", False: "dropped", None: "pending"}[r.get("kept")],
                     **shares(r.get("useful_gflops"), record["peaks"].get(r["cpu"]))})
        if r.get("kept") and r["cpu_seconds"] is not None and (before is None or r["cpu_seconds"] < before):
            best[key] = r["cpu_seconds"]
    columns = [("data", "data", None), ("change", "change", None), ("budget_minutes", "budget (CPU min)", "{:g}"),
               ("minutes", "CPU min to target", "{:.2f}"), ("record_before", "record before", "{:.2f}"),
               ("steps", "steps", None), ("best_val_bpd", "best val", "{:.4f}"),
               ("test_bpd", "test bits/dim", "{:.4f}"),
               ("tokens_per_s", "tokens/s", "{:,.0f}"), ("share", "% fp32 peak", "{:.0f}"),
               ("share_bf16", "% bf16 peak", "{:.0f}"), ("threads", "threads", None), ("verdict", "kept", None),
               ("cpu", "CPU", None), ("load", "load", None), ("date", "date", None)]
    peaks = "; ".join(f"{cpu}: float32 {p['float32']:.0f}, bfloat16 {p['bfloat16']:.0f} GFLOP/s"
                      for cpu, p in record["peaks"].items())
    return ("# Speedrun records\n\nWritten by `imagegen-bench mode=speedrun` (docs/speedrun.json holds every row, "
            "its overrides and run folder). Time to target: CPU minutes of one training process at the first "
            "validation at or under the target. The cores' practical peaks (one thread's best 1024-square "
            f"product; a bfloat16 peak below float32's is emulated, and no share of it is given): {peaks}. The "
            "useful rate counts 6 FLOPs per non-embedding parameter and token and the linear attention's state "
            "work (useful_flops_per_token in benchmarks/speedrun.py), per CPU-second of the run.\n\n"
            + markdown_table(rows, columns))


def add_row(record_path, row, peaks=None):
    """The record with `row` (replacing one of the same run folder) and this CPU's peaks when given, and its
    table, written in the record folder's turn, so that runs finishing at once all stay recorded."""
    record_path.parent.mkdir(parents=True, exist_ok=True)
    with folder_turn(record_path.parent):
        record = read_record(record_path)
        if peaks is not None:
            record["peaks"][row["cpu"]] = peaks
        record["rows"] = [r for r in record["rows"] if r.get("run_dir") != row["run_dir"]] + [row]
        write_bytes(record_path, (json.dumps(record, indent=2) + "\n").encode(), what="speedrun record")
        write_bytes(record_path.with_suffix(".md"), (table(record) + "\n").encode(), what="speedrun table")


def run(c):
    """c: a BenchConfig (or a dict of one); its options: c.speedrun."""
    c = typed(BenchConfig, c)
    s, data = c.speedrun, c.data
    check(s, data.name)
    target = s.target if s.target is not None else TARGETS[data.name]
    out = Path(c.out_dir) / "speedrun-runs"
    record_path = Path(s.record)
    peaks = None if cpu_name() in read_record(record_path)["peaks"] else core_peaks()
    for budget in sorted(s.budgets):
        run_dir = out / f"{data.name}-{slug(s.change)}-{budget:g}m-s{c.seed}"
        argv, log = train_argv(s, data, target, budget, c.seed, run_dir), out / f"{run_dir.name}.log"
        if sweep([(run_dir.name, argv, log)], 1):
            raise UserError(f"the run {run_dir.name} failed; its log: {log}.")
        row = row_of(s, c, data, target, budget, run_dir)
        add_row(record_path, row, peaks)
        said = (f"reached {target} in {row['cpu_seconds'] / 60:.2f} CPU min ({row['steps']} steps)" if row["reached"]
                else f"did not reach {target} (best {row['best_val_bpd']:.4f})")
        print(f"{s.change}, budget {budget:g} min: {said}; wrote {record_path} and its .md", flush=True)
        if row["reached"]:
            break
