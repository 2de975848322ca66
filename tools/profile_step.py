"""Where a training step's time goes, by operator: torch.profiler over whole-model training steps
(forward, backward, AdamW) of a preset's architecture at its data's length, float32.

    python -m tools.profile_step --preset paper_mnist --batch 10 --threads 1

Prints the step's CPU time and the top operators by self time, each with its share of the total
and a group (matrix products, the attention, everything else), and writes the same as JSON
(--json). Random weights and bytes: the time of a step does not depend on what it has learned.
"""
import argparse
import json
import time

import torch
from omegaconf import OmegaConf
from torch.profiler import ProfilerActivity, profile

from imagegen.ops.allocator import for_device
from imagegen.config import ModelConfig
from imagegen.data.catalogue import DATASETS
from imagegen.paths import data_dir
from imagegen.benchmarks.attention import training_step
from imagegen.benchmarks.report import machine
from imagegen.errors import one_line

PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")


def group(name):
    """The share a row counts in: the model's matrix products, its attention (the fused linear kernel,
    torch's softmax attention), or the rest."""
    if name in PRODUCTS:
        return "products"
    if "LinearAttention" in name or "attention" in name or "causal_product" in name:
        return "attention"
    return "other"


def model_config(preset, attention):
    """The preset's architecture (conf/preset/<preset>.yaml) over the typed defaults."""
    path = data_dir("conf") / "preset" / f"{preset}.yaml"
    if not path.is_file():
        choices = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise SystemExit(f"error: no preset {preset!r}; choose one of: {', '.join(choices)}.")
    model = {**vars(ModelConfig()), **OmegaConf.to_container(OmegaConf.load(path)).get("model", {})}
    return {**model, "attention": attention, "attention_options": {"impl": "auto"} if attention == "linear" else {}}


def profile_steps(model_cfg, data, batch, steps):
    """(CPU seconds of one step, rows {name, self_ms per step, share, group, calls per step})."""
    step = training_step(model_cfg, data, DATASETS[data].length, batch, "float32", torch.device("cpu"))
    step(), step()                                            # warm-up: allocations, kernel choice
    begin = time.process_time()
    step()
    seconds = time.process_time() - begin
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    rows = [{"name": e.key, "self_ms": e.self_cpu_time_total / 1e3 / steps, "share": e.self_cpu_time_total / total,
             "group": group(e.key), "calls": e.count // steps}
            for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)]
    return seconds, rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="paper_mnist", help="architecture: a file of conf/preset (default paper_mnist)")
    p.add_argument("--data", default="mnist", choices=sorted(DATASETS), help="the length and shape of an image")
    p.add_argument("--attention", default="linear", choices=("linear", "softmax"))
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=2, help="profiled steps (after 3 unprofiled ones)")
    p.add_argument("--top", type=int, default=12, help="operators listed")
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    for_device(torch.device("cpu"))                          # memory as every command sets it
    cfg = model_config(a.preset, a.attention)
    seconds, rows = profile_steps(cfg, a.data, a.batch, a.steps)
    shares = {g: sum(r["share"] for r in rows if r["group"] == g) for g in ("products", "attention", "other")}
    print(f"{a.preset} ({cfg['n_layers']} layers, d_model {cfg['d_model']}), {a.attention}, {a.data}, batch {a.batch}, "
          f"float32, {a.threads} thread(s); {machine()}")
    print(f"one step: {seconds:.2f} s of CPU time; matrix products {shares['products']:.1%}, attention "
          f"{shares['attention']:.1%}, everything else {shares['other']:.1%}\n")
    print("| operator | ms / step (self) | share | group | calls / step |\n|---|---|---|---|---|")
    for r in rows[:a.top]:
        print(f"| {r['name']} | {r['self_ms']:.1f} | {r['share']:.1%} | {r['group']} | {r['calls']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "machine": machine(), "step_cpu_s": seconds, "shares": shares,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    one_line(main)()
