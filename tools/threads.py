"""Thread counts on a shared machine: the small preset's sampling step and training step with one core
kept busy by a spinning subprocess, at the default settings (threads=0: imagegen.tuning.threads.fit_threads,
measuring the free cores as every command does at start) against threads=1 and torch's own default,
each in a fresh process (so that OMP_* variables reach OpenMP before torch loads), in one run.

    python -m tools.threads --out bench/threads.json     # about a minute on 2 cores

Images/sec are those of the step loop (batch / (sub-pixels x seconds per step), timed for --seconds
at --batch; a whole image at torch's default could take minutes); the training step is the median of
the steps that fit in --seconds at batch 4. docs/threads.md holds a run's table.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from imagegen.errors import one_line

SETTINGS = {                 # name -> (threads argument, extra environment)
    "default (threads=0)": (0, {}),
    "threads=1": (1, {}),
    "torch's default": (None, {}),
    "torch's default, OMP_WAIT_POLICY=PASSIVE": (None, {"OMP_WAIT_POLICY": "PASSIVE"}),
}

CHILD = r"""
import json, sys, time
import torch
from imagegen import config
from imagegen.commands.cli import compose
from omegaconf import OmegaConf
from imagegen.data.sets import dataset_info
from imagegen.model.transformer import build_model
from imagegen.tuning.threads import fit_threads

threads, seconds, batch = json.loads(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
if threads is not None:
    fit_threads(threads)                   # what every command does at start
config.register()
cfg = OmegaConf.to_container(compose("train", ["preset=small", "model.attention_options.impl=chunked", "run_dir=x"]),
                             resolve=True)
info = dataset_info(cfg["data"])
torch.manual_seed(0)
model = build_model(cfg["model"], info)
out = {"threads": torch.get_num_threads()}
with torch.inference_mode():
    model.eval()
    tok = torch.zeros(batch, dtype=torch.long)
    state = model.init_state(batch, torch.device("cpu"), torch.float32)
    for _ in range(3):
        model.step(tok, state)
    n, begin = 0, time.perf_counter()
    while time.perf_counter() - begin < seconds or n < 3:
        model.step(tok, state)
        n += 1
        if n % (info.length - 10) == 0:
            state = model.init_state(batch, torch.device("cpu"), torch.float32)
    step = (time.perf_counter() - begin) / n
out.update(step_ms=step * 1e3, images_per_sec=batch / (info.length * step))
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randint(0, 256, (4, info.length))
def train_step():
    loss = -model.head.log_prob(model(x).float(), x).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
train_step()
times, begin = [], time.perf_counter()
while time.perf_counter() - begin < seconds or len(times) < 3:
    t = time.perf_counter()
    train_step()
    times.append(time.perf_counter() - t)
out["train_step_ms"] = sorted(times)[len(times) // 2] * 1e3
print(json.dumps(out))
"""


def spinner():
    """A subprocess keeping one core busy until it is ended."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run_setting(threads, env, seconds, batch):
    child_env = {**os.environ, **env, "IMAGEGEN_PROBE": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(threads), str(seconds), str(batch)],
                         env=child_env, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise SystemExit(f"the {threads} child failed:\n{out.stderr}")
    said = [line for line in out.stderr.splitlines() if line.startswith("imagegen:")]
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "said": said}


def main(argv=None):
    from imagegen.tuning.machine import cpu_name
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/threads.json")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds timed per part and setting")
    p.add_argument("--batch", type=int, default=8, help="batch of the sampling step loop")
    p.add_argument("--no-spin", action="store_true", help="time without the spinning subprocess")
    a = p.parse_args(argv)
    spin = None if a.no_spin else spinner()
    try:
        time.sleep(0.5)
        load_before = os.getloadavg()[0]
        rows = {name: run_setting(threads, env, a.seconds, a.batch) for name, (threads, env) in SETTINGS.items()}
    finally:
        if spin is not None:
            spin.kill()
            spin.wait()
    one = rows["threads=1"]
    for row in rows.values():
        row["vs_threads_1"] = {"images_per_sec": row["images_per_sec"] / one["images_per_sec"],
                               "train_step": one["train_step_ms"] / row["train_step_ms"]}
    result = {"cpu": cpu_name(), "cores": os.cpu_count(), "spinner": spin is not None, "loadavg_1min": load_before,
              "when": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": a.seconds, "batch": a.batch, "rows": rows,
              "target": "default >= 0.7x threads=1 in images/sec",
              "met": rows["default (threads=0)"]["vs_threads_1"]["images_per_sec"] >= 0.7}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['cpu']}, {result['cores']} cores, {'one core kept busy by a spinner' if spin else 'no spinner'}, "
          f"1-min load {load_before:.2f} before; small preset, float32")
    print(f"| setting | torch threads | step ms (batch {a.batch}) | images/sec | vs threads=1 "
          f"| train step ms (batch 4) | vs threads=1 |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        ratio = r["vs_threads_1"]
        print(f"| {name} | {r['threads']} | {r['step_ms']:.2f} | {r['images_per_sec']:.2f} | "
              f"{ratio['images_per_sec']:.2f}x | {r['train_step_ms']:.0f} | {ratio['train_step']:.2f}x |")
    print(f"wrote {a.out}; target {'met' if result['met'] else 'NOT met'}: {result['target']}")


if __name__ == "__main__":
    one_line(main)()
