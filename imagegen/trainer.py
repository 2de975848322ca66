"""Training loop and bits/dim evaluation, driven by a plain config dict (see conf/train.yaml)."""
import json
import math
import signal
import time
from pathlib import Path

import torch
from tqdm import tqdm

from . import checkpoint
from .allocator import keep_freed_memory
from .data import dataset_info, load_from_config
from .errors import UserError
from .model import build_model
from .precision import autocast, bf16_reason, use_bf16

LN2 = math.log(2)


@torch.no_grad()
def total_nll(model, x, batch_size, device, progress=False, desc="eval"):
    """Sum of -log p in nats over all images and sub-pixels of x (B, D) uint8."""
    model.eval()
    total = torch.zeros((), dtype=torch.float64)
    for i in tqdm(range(0, len(x), batch_size), desc=desc, disable=not progress, leave=False):
        total += model.nll(x[i:i + batch_size].to(device)).double().sum().cpu()
    return total.item()


def bits_per_dim(model, x, batch_size, device, progress=False):
    """Exact bits/dim: total NLL in nats / (images x D x ln 2)."""
    return total_nll(model, x, batch_size, device, progress) / (x.numel() * LN2)


def make_optimizer(params, t):
    kinds = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "radam": torch.optim.RAdam}
    if t["optimizer"] not in kinds:
        raise UserError(f"unknown optimizer {t['optimizer']!r}; choose one of {sorted(kinds)}.")
    return kinds[t["optimizer"]](params, lr=t["lr"], betas=tuple(t["betas"]), weight_decay=t["weight_decay"])


def learning_rate(t, step, elapsed):
    """Linear warmup, then cosine decay to lr * min_lr_ratio over the step or time budget,
    whichever runs out first."""
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    progress = (step - t["warmup_steps"]) / max(1, t["max_steps"] - t["warmup_steps"])
    if t["max_minutes"]:
        progress = max(progress, elapsed / (60 * t["max_minutes"]))
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return t["lr"] * (t["min_lr_ratio"] + (1 - t["min_lr_ratio"]) * cosine)


def train(cfg, device):
    """Train per cfg (a plain dict), writing last.pt / best.pt / metrics.jsonl in cfg['run_dir']."""
    t, d = cfg["train"], cfg["data"]
    run_dir = Path(cfg["run_dir"])
    info = dataset_info(d["name"])
    bf16 = use_bf16(t["bf16"], device)
    if device.type == "cpu":
        keep_freed_memory()
    x_train, x_val = load_from_config(d, ("train", "val"))
    x_val = x_val[: t["val_images"]]
    if len(x_train) < t["batch_size"]:
        raise UserError(f"the training split holds {len(x_train)} images, fewer than train.batch_size="
                        f"{t['batch_size']}; lower the batch size or add data.")

    torch.manual_seed(cfg["seed"])
    model = build_model(cfg["model"], info).to(device)
    opt = make_optimizer(model.parameters(), t)
    state = {"step": 0, "elapsed": 0.0, "epoch": 0, "batch": 0, "best_val": float("inf")}
    last = run_dir / "last.pt"
    if t["resume"] and last.exists():
        ck = checkpoint.load(last)
        checkpoint.check_compatible(ck, cfg, last)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        state.update(ck["state"])
        torch.set_rng_state(ck["rng"])
        print(f"resuming {last} at step {state['step']} ({state['elapsed'] / 60:.1f} min trained)")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{cfg['model']['attention']} model, {n_params / 1e6:.2f}M parameters, {len(x_train)} training images "
          f"of {info.length} sub-pixels, device {device}"
          f", {bf16_reason(t['bf16'], device)}, run dir {run_dir}")

    def save(name):
        checkpoint.save(run_dir / name, {"config": cfg, "model": model.state_dict(), "optimizer": opt.state_dict(),
                                         "state": dict(state), "rng": torch.get_rng_state()})

    def validate():
        bpd = bits_per_dim(model, x_val, t["batch_size"], device)
        model.train()
        log({"step": state["step"], "val_bpd": bpd})
        if bpd < state["best_val"]:
            state["best_val"] = bpd
            save("best.pt")
        return bpd

    run_dir.mkdir(parents=True, exist_ok=True)
    metrics = open(run_dir / "metrics.jsonl", "a")

    def log(row):
        metrics.write(json.dumps(row) + "\n")
        metrics.flush()

    def batches():
        """Seeded shuffles per epoch; resumes at the saved epoch and batch."""
        while True:
            g = torch.Generator().manual_seed(cfg["seed"] * 100003 + state["epoch"])
            perm = torch.randperm(len(x_train), generator=g)
            n = len(x_train) // t["batch_size"]
            while state["batch"] < n:
                idx = perm[state["batch"] * t["batch_size"]:(state["batch"] + 1) * t["batch_size"]]
                state["batch"] += 1
                yield x_train[idx].to(device, non_blocking=True)
            state["epoch"], state["batch"] = state["epoch"] + 1, 0

    def budget_left():
        return state["step"] < t["max_steps"] and not (t["max_minutes"] and state["elapsed"] >= 60 * t["max_minutes"])

    if not budget_left():
        print(f"nothing to do: {last} already holds {state['step']} steps; raise train.max_steps or "
              f"train.max_minutes to train on")
        return state

    def interrupt(signum, frame):              # SIGTERM (e.g. a job scheduler) stops like Ctrl-C: save, then exit
        raise KeyboardInterrupt

    previous_sigterm = signal.signal(signal.SIGTERM, interrupt)
    model.train()
    bar = tqdm(total=t["max_steps"], initial=state["step"], unit="step", dynamic_ncols=True,
               disable=not t["progress"])
    data = batches()
    window_tokens, window_start = 0, time.perf_counter()
    try:
        while budget_left():
            tick = time.perf_counter()
            x = next(data)
            lr = learning_rate(t, state["step"], state["elapsed"])
            for group in opt.param_groups:
                group["lr"] = lr
            with autocast(device, bf16):
                loss = model.nll(x).mean()           # nats per sub-pixel
            if not torch.isfinite(loss):
                raise UserError(f"the loss became {loss.item()} at step {state['step']}; lower train.lr or "
                                f"raise train.warmup_steps, then resume from {last} or start over.")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if t["grad_clip"]:
                torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
            opt.step()
            state["step"] += 1
            state["elapsed"] += time.perf_counter() - tick
            window_tokens += x.numel()
            bar.update(1)
            if state["step"] % t["log_every"] == 0:
                now = time.perf_counter()
                bpd = loss.item() / LN2
                tps = window_tokens / (now - window_start)
                window_tokens, window_start = 0, now
                bar.set_postfix(loss=f"{loss.item():.4f}", bpd=f"{bpd:.4f}", tok_s=f"{tps:.0f}",
                                min=f"{state['elapsed'] / 60:.1f}")
                log({"step": state["step"], "loss": loss.item(), "bpd": bpd, "lr": lr, "tokens_per_s": tps,
                     "elapsed": state["elapsed"]})
            if state["step"] % t["val_every"] == 0:
                bar.write(f"step {state['step']}: val bits/dim {validate():.4f}")
            if state["step"] % t["save_every"] == 0:
                save("last.pt")
    except KeyboardInterrupt:
        save("last.pt")
        bar.close()
        print(f"interrupted: saved {last} at step {state['step']}; run the same command again to resume")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
    bar.close()
    if state["step"] % t["val_every"]:
        print(f"step {state['step']}: val bits/dim {validate():.4f}")
    save("last.pt")
    metrics.close()
    print(f"done: {state['step']} steps in {state['elapsed'] / 60:.1f} min; best val bits/dim "
          f"{state['best_val']:.4f}; checkpoints {run_dir}/last.pt and best.pt")
    return state
