"""The training loop: step, schedule, budget. The pieces it calls live in their own homes:
runstate (data order, position, budget), checkpoint (save, checked load), distributed (ranks,
reductions), logs (metrics.jsonl, TensorBoard), signals (stop requests), bits_per_dim,
lock (the run dir). Under torchrun every rank runs this; rank 0 alone writes.
"""
import copy
import math
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ..bits_per_dim import LN2, bits_per_dim
from ..config import TrainConfig, check_train, plain, typed
from ..data.sets import dataset_info, load_from_config
from ..dtypes import autocast
from ..errors import UserError, printable
from ..lock import folder_lock
from ..memory import check_forward_fits
from ..model.transformer import build_model
from ..ops import auto_impl_line, ensure_kernel
from ..precision import decide_bf16
from ..sampling.decode import generate, grid, to_images
from ..store import checkpoint
from ..store.format import advice
from ..store.checks import check_compatible, check_resumable, check_training, check_weights_fit
from ..tuning import probe
from ..tuning.choice import Choice
from ..tuning.machine import available_bytes
from ..tuning.threads import Watch
from ..world import lost, max_, sum_
from . import distributed, rundir
from .logs import RunLog
from .optim import make_optimizer
from .runstate import Budget, DataOrder, RunState, step_seed
from .signals import StopRequest


def lr_factor(t, step, elapsed):
    """The share of each group's peak learning rate at `step`: linear warmup, then a cosine or linear
    (train.decay) decay to min_lr_ratio over the step or time budget, whichever runs out first."""
    if step < t.warmup_steps:
        return (step + 1) / t.warmup_steps
    progress = (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps)
    if t.max_minutes:
        progress = max(progress, elapsed / (60 * t.max_minutes))
    progress = min(1.0, progress)
    left = 1 - progress if t.decay == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return t.min_lr_ratio + (1 - t.min_lr_ratio) * left


def zero_output_projections(model):
    """Zero every block's output projections (attention and feed-forward) and the head's, so that each
    block starts as the identity and the model as the uniform distribution (train.zero_init)."""
    with torch.no_grad():
        for block in model.blocks:
            for dense in (block.attn.out, block.ff[2]):
                dense.weight.zero_()
        model.proj.weight.zero_()


def precision_name(bf16):
    return "bfloat16" if bf16 else "float32"


def prepare_run_dir(cfg):
    """Absolute run_dir and data.root (a checkpoint then works from any directory); run_dir a folder."""
    run_dir = Path(cfg.run_dir).expanduser().resolve()
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"run_dir {run_dir} is a file, not a folder; choose another run_dir=...")
    cfg.run_dir = str(run_dir)
    cfg.data.root = str(Path(cfg.data.root).expanduser().resolve())
    return run_dir


def train(cfg, device):
    """Train per cfg (a TrainConfig, or a dict of one), writing last.pt / best.pt / metrics.jsonl in cfg.run_dir;
    under torchrun, as one rank of the job. Returns the final RunState."""
    cfg = typed(TrainConfig, cfg)
    world, device = distributed.setup(device, cfg.dist_timeout_s)
    try:
        check_train(cfg, available_bytes(device), dataset_info(plain(cfg.data)).length)
        if cfg.train.batch_size % world.size:
            raise UserError(f"train.batch_size={cfg.train.batch_size} does not divide among {world.size} "
                            f"processes; use a multiple of {world.size}.")
        run_dir = prepare_run_dir(cfg)
        created = not run_dir.exists()
        run_dir.mkdir(parents=True, exist_ok=True)
        with folder_lock(run_dir, created=created, scratch=(".hydra",)) if world.main else nullcontext():
            trainer = Trainer(cfg, device, world, run_dir)
            try:
                return trainer.run()
            finally:
                trainer.release()
    except RuntimeError as e:                  # DDP's gradient all-reduce when another rank died
        raise (lost(world, e) or e) from None
    finally:
        distributed.teardown(world)


class Trainer:
    def __init__(self, cfg, device, world, run_dir):
        self.cfg, self.t, self.device, self.world, self.run_dir = cfg, cfg.train, device, world, run_dir
        t, data = self.t, plain(cfg.data)
        self.dims = (cfg.model.d_model, cfg.model.d_ff)    # the products bf16=auto measures
        self.bf16_choice = decide_bf16(t.bf16, device, dims=self.dims)
        self.bf16 = self.bf16_choice.value
        (self.x_train, self.y_train), (x_val, y_val) = load_from_config(data, ("train", "val"), labels=True)
        self.x_val, self.y_val = x_val[: t.val_images], y_val[: t.val_images]
        self.info = dataset_info(data)
        self.stored = plain(cfg)             # the config as the checkpoints and the run's .hydra record hold it
        if cfg.data.name == "folder":          # kept in the checkpoints, for use without the folder
            self.stored["data"]["class_names"] = list(self.info.class_names)
        classes = cfg.model.num_classes
        if classes and classes != self.info.num_classes:
            raise UserError(f"model.num_classes={classes}, but {self.info.name} has {self.info.num_classes} classes; "
                            f"set model.num_classes={self.info.num_classes} (or 0 for an unconditional model).")
        if len(self.x_train) < t.batch_size:
            raise UserError(f"the training split holds {len(self.x_train)} images, fewer than train.batch_size="
                            f"{t.batch_size}; lower the batch size or add data.")
        torch.manual_seed(cfg.seed)
        self.model = build_model(plain(cfg.model), self.info).to(device)
        check_forward_fits(self.model, t.batch_size // world.size, device, "train.batch_size", training=True,
                           bytes_per_value=2 if self.bf16 else 4)
        if t.zero_init:
            zero_output_projections(self.model)
        self.opt = make_optimizer(self.model, t, self.bf16)
        self.peaks = [g["lr"] for g in self.opt.param_groups]      # each group's peak, before any resume
        self.ema = copy.deepcopy(self.model).requires_grad_(False) if t.ema else None
        self.state = RunState()
        self.reached = False                 # a validation met train.target_bpd: the run stops
        self.order = DataOrder(len(self.x_train), t.batch_size, cfg.seed, world)
        self.budget = Budget(t.max_steps, t.max_minutes)
        self.last = run_dir / "last.pt"
        if world.main:                       # we hold the run_dir: temporary files there are a dead run's
            for tmp in run_dir.glob(".*.tmp"):
                tmp.unlink()
            rundir.start(run_dir, t, self.stored, resuming=t.resume and self.last.exists(), say=self.say)
        self.log = RunLog(run_dir, tensorboard=t.tensorboard, enabled=world.main)
        if t.resume and self.last.exists():
            self.resume()
        elif t.init:
            self.start_from(t.init)
        self.prebuild_kernels()
        # threads=0 on the CPU: fewer threads when the steps slow down sharply and fewer cores are free
        self.watch = (Watch(tell=lambda line: self.say(f"step {self.state.step}: {line}"))
                      if device.type == "cpu" and not cfg.threads and probe.enabled() else None)
        # last, so that nothing raising in here leaves a DDP wrapper behind in a traceback (see `release`)
        self.net = DistributedDataParallel(self.model) if world.distributed else self.model

    def release(self):
        """Drop the DDP wrapper, before `distributed.teardown`. Its reducer holds the process group:
        freed after teardown (say, with a traceback holding this Trainer) it would destroy the group
        holding the GIL, and wait forever for a gloo thread that needs the GIL to free a tensor."""
        self.net = None

    def say(self, text):
        if self.world.main:
            tqdm.write(printable(text))        # a run_dir or file name escaped, as say.show does

    def resume(self):
        with advice(f"start over with train.resume=false train.overwrite=true (the run's files move into "
                    f"{self.last.parent}/previous-<time>/), or start another run_dir from its best.pt with "
                    f"train.init=PATH"):
            ck = checkpoint.load(self.last)
            check_training(ck, self.last)
            changed = check_compatible(ck, self.stored, self.last)
            check_resumable(ck, self.model, self.opt, self.last)
        self.keep_precision(ck.get("precision"))
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["optimizer"])
        if self.ema is not None:             # a run that turns the average on starts it from the weights
            self.ema.load_state_dict(ck.get("ema", ck["model"]))
        old = ck["config"].get("train")          # the run's own settings (older checkpoints: none stored)
        self.state = RunState.from_dict(ck["state"], self.t.batch_size if old is None else old["batch_size"])
        self.log.truncate_after(self.state.step)
        self.say(f"resuming {self.last} at step {self.state.step} ({self.state.elapsed / 60:.1f} min trained)"
                 + (f"; changed since: {', '.join(changed)}" if changed else ""))

    def keep_precision(self, saved):
        """Resume in the precision the run trained in: train.bf16=auto takes it; another explicit one is refused."""
        now = precision_name(self.bf16)
        if saved is None or saved == now:
            return
        if self.t.bf16 == "auto":
            self.bf16 = saved == "bfloat16"
            self.bf16_choice = Choice(self.bf16, f"{saved} (train.bf16=auto: the precision {self.last} was "
                                                 f"trained in)")
            self.opt = make_optimizer(self.model, self.t, self.bf16)         # Muon orthogonalises in it
            self.say(f"training on in {saved}, the precision {self.last} was trained in (train.bf16=auto)")
            return
        raise UserError(f"{self.last} was trained in {saved}, but train.bf16={str(self.t.bf16).lower()} asks for "
                        f"{now}; resume with train.bf16=auto (keeps {saved}), or start over with train.resume=false "
                        f"train.overwrite=true or another run_dir.")

    def start_from(self, spec):
        with advice("pass another train.init, e.g. a run's best.pt, or drop train.init"):
            weights = checkpoint.initial_weights(spec, self.stored)   # the same architecture and image shape
            check_weights_fit(weights, self.model, spec)
        self.model.load_state_dict(weights)
        if self.ema is not None:
            self.ema.load_state_dict(weights)
        self.say(f"starting from the weights of {spec} (train.init)")

    def prebuild_kernels(self):
        """Build the C++ kernel (first use: a minute) now, so its time stays out of the budget and the rate."""
        m = self.cfg.model
        if (self.device.type == "cpu" and m.attention == "linear"
                and plain(m.attention_options or {}).get("impl", "auto") in ("auto", "kernel")):
            ensure_kernel("cpu")

    def save(self, name):
        if self.world.main:
            extra = {} if self.ema is None else {"ema": self.ema.state_dict()}
            checkpoint.save(self.run_dir / name, {"config": self.stored, "model": self.model.state_dict(), **extra,
                                                  "optimizer": self.opt.state_dict(), "state": self.state.to_dict(),
                                                  "precision": precision_name(self.bf16)})

    @property
    def inference_model(self):
        """What validation, best.pt and sample grids judge: the average of the weights when train.ema is on."""
        return self.model if self.ema is None else self.ema

    @torch.no_grad()
    def update_ema(self):
        """ema = d ema + (1 - d) weights, with d ramping up as (1 + step) / (10 + step) to train.ema, so
        that the average does not start out dominated by the random initial weights; buffers (a feature
        map's random draw) are copied, never averaged."""
        d = min(self.t.ema, (1 + self.state.step) / (10 + self.state.step))
        for avg, w in zip(self.ema.parameters(), self.model.parameters()):
            avg.lerp_(w, 1 - d)
        for kept, b in zip(self.ema.buffers(), self.model.buffers()):    # a feature map's random draw: the current one
            kept.copy_(b)

    def labels(self, idx):
        """This rank's labels (N,) for a class-conditional model, each dropped (-1) with probability
        train.label_dropout; None for an unconditional one. Which images of the global batch lose
        their label depends on (seed, step) only, so any number of processes drops the same ones."""
        if not self.model.num_classes:
            return None
        g = torch.Generator().manual_seed(step_seed(self.cfg.seed, self.state.step, 0))
        start, stop = self.world.shard(self.t.batch_size)
        drop = (torch.rand(self.t.batch_size, generator=g) < self.t.label_dropout)[start:stop]
        return torch.where(drop, -1, self.y_train[idx]).to(self.device)

    def validate(self):
        labels = self.y_val if self.model.num_classes else None
        bpd = bits_per_dim(self.inference_model, self.x_val, self.t.batch_size, self.device, world=self.world,
                           labels=labels)
        row = {"val_bpd": bpd, "elapsed": self.state.elapsed, "wall": self.state.wall}
        if self.ema is not None:             # the raw weights too, so a run shows what the average gains
            row["val_bpd_raw"] = bits_per_dim(self.model, self.x_val, self.t.batch_size, self.device,
                                              world=self.world, labels=labels)
        self.log.scalars(self.state.step, row)
        target = self.t.target_bpd
        if target is not None and bpd <= target:
            self.reached = True
            self.log.scalars(self.state.step, {"target_reached": target, "elapsed": self.state.elapsed})
        if bpd < self.state.best_val:
            self.state.best_val = bpd
            self.save("best.pt")
        raw = f" (raw weights {row['val_bpd_raw']:.4f})" if "val_bpd_raw" in row else ""
        self.say(f"step {self.state.step}: val bits/dim {bpd:.4f}{raw}" + (" (best.pt saved)" if
                                                                              bpd == self.state.best_val else ""))

    def sample(self):
        """A small grid from the model as it stands (rank 0), seeded alike at every step for comparison."""
        if not self.world.main:
            return
        n, model = self.t.sample_images, self.inference_model
        labels = torch.arange(n) % model.num_classes if model.num_classes else None     # classes in turn
        seqs = generate(model, n, seed=self.cfg.seed, batch_size=n, labels=labels)
        self.model.train()
        self.last_sample = self.state.elapsed
        image = np.asarray(grid(to_images(seqs, self.info), nrow=math.ceil(math.sqrt(n)), scale=2))
        path = self.log.image(self.state.step, "samples", image if image.ndim == 3 else image[..., None])
        self.say(f"step {self.state.step}: samples {path}")

    def header(self):
        n_params = sum(p.numel() for p in self.model.parameters())
        world = f", {self.world.size} processes" if self.world.distributed else ""
        self.say(f"{self.cfg.model.attention} model, {n_params / 1e6:.2f}M parameters, {len(self.x_train)} "
                 f"training images of {self.model.length} sub-pixels, device {self.device}{world}, "
                 f"{self.bf16_choice.reason}, run dir {self.run_dir}")
        if (line := auto_impl_line(plain(self.cfg.model), self.model.length, self.device, self.bf16)) is not None:
            self.say(line)

    def run(self):
        state, t = self.state, self.t
        self.header()
        if self.budget.spent(state):
            self.say(f"nothing to do: {self.last} already holds {state.step} steps; raise train.max_steps or "
                     f"train.max_minutes to train on")
            return state
        if t.target_bpd is not None and state.best_val <= t.target_bpd:
            self.say(f"nothing to do: {self.last} already reached train.target_bpd={t.target_bpd} (best "
                     f"validation {state.best_val:.4f}); lower the target or drop it to train on")
            return state
        self.model.train()
        self.last_sample = state.elapsed                 # train.sample_minutes counts from here
        progress = Progress(self, enabled=self.world.main)
        clock = time.process_time if t.clock == "cpu" else time.perf_counter
        with StopRequest() as stop:
            while True:
                tick, wall_tick = clock(), time.perf_counter()
                idx = self.order.batch(state)
                x = self.x_train[idx].to(self.device, non_blocking=True)
                torch.manual_seed(step_seed(self.cfg.seed, state.step, self.world.rank))
                y = self.labels(idx)
                with autocast(self.device, self.bf16):
                    # model.nll through self.net, so that DDP hooks the forward and syncs the gradients
                    loss = -self.model.head.log_prob(self.net(x, y).float(), x).mean()   # nats per sub-pixel
                # every rank agrees on stopping (a signal anywhere, rank 0's budget) and on rank 0's clock
                signalled, spent, bad, elapsed = max_(self.world, [
                    stop.signal is not None, self.world.main and self.budget.spent(state),
                    not torch.isfinite(loss).item(), state.elapsed if self.world.main else 0.0])
                state.elapsed = elapsed
                if bad:
                    then = (f"resume from {self.last} or start over" if self.last.exists() else
                            "run the command again (no checkpoint was saved yet)")
                    raise UserError(f"the loss became non-finite at step {state.step}; lower train.lr or raise "
                                    f"train.warmup_steps, then {then}.")
                if signalled or spent:
                    break
                factor = lr_factor(t, state.step, state.elapsed)
                for group, peak in zip(self.opt.param_groups, self.peaks):
                    group["lr"] = peak * factor
                lr = t.lr * factor
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                if t.grad_clip:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip)
                self.opt.step()
                if self.ema is not None:
                    self.update_ema()
                state.step += 1
                self.order.advance(state)                     # the batch counts once it is trained on
                seconds = clock() - tick
                state.elapsed += seconds
                state.wall += time.perf_counter() - wall_tick
                progress.step(loss, lr, x.numel() * self.world.size)
                if self.watch is not None:
                    self.watch.step(seconds)                  # outside the step's time: a look sleeps 0.2 s
                self.at_step_end()
                if self.reached:
                    self.say(f"step {state.step}: validation reached train.target_bpd={t.target_bpd} after "
                             f"{state.elapsed / 60:.2f} min of training; stopping")
                    break
            # the last save inside the handlers too: a rank stopped by another's signal may get its own
            # first one now (torchrun killed: each rank's parent watch fires in its own time), which
            # must not kill it mid-save as the default SIGTERM action would
            progress.close()
            if signalled:
                self.save("last.pt")
                self.say(f"stopped by {stop.signal or 'another process'} at step {state.step}: saved {self.last}; "
                         f"run the same command again to resume")
                self.log.close()
                raise KeyboardInterrupt
            if state.step % t.val_every:
                self.validate()
            self.save("last.pt")
            self.log.close()
        self.say(f"done: {state.step} steps in {state.elapsed / 60:.1f} min; best val bits/dim "
                 f"{state.best_val:.4f}; checkpoints {self.run_dir}/last.pt and best.pt")
        return state

    def at_step_end(self):
        step, t = self.state.step, self.t
        if step % t.val_every == 0:
            self.validate()
        by_time = t.sample_minutes and self.state.elapsed - self.last_sample >= 60 * t.sample_minutes
        if (t.sample_every and step % t.sample_every == 0) or by_time:
            self.sample()
        if step % t.save_every == 0:
            self.save("last.pt")
            self.say(f"step {step}: saved {self.last}")


class Progress:
    """The progress bar (its total follows whichever budget binds), or a one-line log every 30 s
    with train.progress=false; metrics rows every train.log_every steps. Rank 0 only."""

    def __init__(self, trainer, enabled):
        self.tr, self.enabled = trainer, enabled
        state = trainer.state
        # a time budget's step count is known after the first step: no total (and no ETA) until then
        total = None if trainer.budget.max_seconds else trainer.budget.max_steps
        self.bar = tqdm(total=total, initial=state.step, unit="step", dynamic_ncols=True,
                        disable=not (enabled and trainer.t.progress))
        self.start_step, self.start_elapsed = state.step, state.elapsed
        self.window_tokens, self.window_start, self.last_print = 0, time.perf_counter(), 0.0

    def step(self, loss, lr, tokens):
        tr, state = self.tr, self.tr.state
        self.window_tokens += tokens
        rate = (state.elapsed - self.start_elapsed) / max(1, state.step - self.start_step)
        self.bar.total = tr.budget.expected_total(state, rate)
        self.bar.update(1)
        if state.step % tr.t.log_every:
            return
        loss = sum_(tr.world, [loss.item()])[0] / tr.world.size      # the global batch's mean
        if not self.enabled:
            return
        now = time.perf_counter()
        tps = self.window_tokens / (now - self.window_start)
        self.window_tokens, self.window_start = 0, now
        bpd = loss / LN2
        self.bar.set_postfix(loss=f"{loss:.4f}", bpd=f"{bpd:.4f}", tok_s=f"{tps:.0f}", min=f"{state.elapsed / 60:.1f}")
        tr.log.scalars(state.step, {"loss": loss, "bpd": bpd, "lr": lr, "tokens_per_s": tps,
                                    "elapsed": state.elapsed})
        if not tr.t.progress and now - self.last_print >= 30:
            self.last_print = now
            print(f"step {state.step}/{self.bar.total}: loss {loss:.4f}, bits/dim {bpd:.4f}, {tps:.0f} tokens/s, "
                  f"{state.elapsed / 60:.1f} min", flush=True)

    def close(self):
        self.bar.close()
