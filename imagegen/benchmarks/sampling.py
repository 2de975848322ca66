"""Images/sec of the four samplers for one architecture, the paper's Tables 1, 2 and 5 in spirit.

Method. The cost of sampling one batch is the sum of its D per-position step costs. We time
steps at `sampling.n_positions` evenly spaced positions t (after warm-up steps) and integrate the
per-step latency over all D positions by linear interpolation:
- step samplers (linear recurrent, softmax KV cache): the decoding state is advanced to
  position t directly (the cache is preallocated; its contents do not change the cost), then
  `reps` steps are timed;
- recompute samplers: one `model.forward` over the prefix of length t + 1 plus a draw.
images/sec = batch / integrated seconds. Each method is measured at every batch size of its
bounded sweep and reported at its best; batch 1 gives seconds per image (Table 5), and for
the step samplers one whole image is also sampled at batch 1 and timed end to end.
Each method runs in every precision of `sampling.precisions` (float32; bfloat16: the step loops'
products in bfloat16 with weights converted once, the KV cache float32 except for the method
softmax-kv-cache-bf16, the recompute loop under bfloat16 autocast; int8: 8-bit Dense weights, activations
quantized per row, the state float32, through the one-call C++ step where the kernel's int8 product runs;
see `imagegen.sampling.decode`),
the precisions in turn at each position, so that a shared machine's changing load reaches both
and the "x float32" ratio compares like with like. The default [float32, auto] measures bfloat16
only where it is fast (`imagegen.precision`), and never int8 (name it: [float32, int8]).
"""
import time

import numpy as np
import torch

from ..config import BenchConfig, ModelConfig, plain, typed
from ..errors import UserError
from ..memory import check_batch_fits
from ..model.transformer import build_model
from ..dtypes import precision_dtype
from ..precision import resolve_precisions
from ..sampling.decode import draw_step, fill_step, int8_forward, recompute_step
from ..sampling.plan import decoding_state
from .. import plots
from .progress import Progress
from .report import machine, markdown_table
from .step_limit import limit_share
from .timing import minor_faults

METHODS = {  # name: (attention, sampler)
    "linear-recurrent": ("linear", "step"),
    "softmax-kv-cache": ("softmax", "step"),
    "softmax-kv-cache-bf16": ("softmax", "step"),   # bfloat16 precision only: the KV cache in bfloat16 too
    "softmax-recompute": ("softmax", "recompute"),
    "lsh-recompute": ("lsh", "recompute"),
}


def timed(fn, reps, faults=None):
    """Seconds per call of fn over reps calls; faults: a list to append the minor page faults per call to."""
    f0, start = minor_faults(), time.perf_counter()
    for _ in range(reps):
        fn()
    seconds = (time.perf_counter() - start) / reps
    if faults is not None:
        faults.append((minor_faults() - f0) / reps)
    return seconds


@torch.inference_mode()
def step_latency(model, batch, t, reps=3, warmup=2, seed=0, dtype=None, faults=None):
    """Seconds per decoding step near position t at this batch size (products in dtype); faults: see `timed`."""
    D = model.length
    t = max(0, min(t, D - reps - warmup))
    state = decoding_state(model, batch, next(model.parameters()).device, dtype)
    state.t = t                                          # jump to position t
    for layer in state.layers:
        if hasattr(layer.attn, "t"):                     # a KV cache's position
            layer.attn.t = t
    g = torch.Generator().manual_seed(seed)
    token = torch.randint(0, 256, (batch,))
    for _ in range(warmup):
        draw_step(model, token, state, 1.0, g)
    return timed(lambda: draw_step(model, token, state, 1.0, g), reps, faults)


@torch.inference_mode()
def recompute_latency(model, batch, t, reps=1, seed=0, dtype=None, faults=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (batch, model.length), dtype=torch.uint8, generator=g)
    with int8_forward(model, dtype):                           # int8: quantized once, outside the timing
        recompute_step(model, x, min(t, 16), 1.0, g, dtype)    # warm-up
        return timed(lambda: recompute_step(model, x, t, 1.0, g, dtype), reps, faults)


@torch.inference_mode()
def whole_image_seconds(model, seed=0, dtype=None):
    """Seconds to sample one whole image at batch 1 with the step loop, timed end to end (the
    paper's Table 5 measure; the per-position estimate misses warm caches and threads)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(1, model.length, dtype=torch.uint8)
    fill_step(model, x, model.length - 16, 1.0, g, dtype=dtype)     # warm-up: the last 16 positions
    return timed(lambda: fill_step(model, x, 0, 1.0, g, dtype=dtype), 1)


def integrate(positions, latencies, D):
    """Total seconds over positions 0..D-1, interpolating the measured latencies linearly."""
    return float(np.interp(np.arange(D), positions, latencies).sum())


def latency(model, sampler, batch, t, reps, dtype=None, faults=None):
    """Seconds per step of this sampler near position t; faults: see `timed`."""
    return step_latency(model, batch, t, reps, dtype=dtype, faults=faults) if sampler == "step" else \
        recompute_latency(model, batch, t, dtype=dtype, faults=faults)


def measure(model, sampler, batch, positions, reps, dtype=None):
    lat = [latency(model, sampler, batch, t, reps, dtype) for t in positions]
    return integrate(positions, lat, model.length), lat


def row_of(name, precision, batch, positions, lat, D, probe_positions, faults=()):
    """The result row of one method, precision and batch from its per-position latencies (and the
    minor page faults per timed call at each position)."""
    seconds = integrate(positions, lat, D)
    row = {"method": name, "precision": precision, "batch": batch, "seconds_per_batch": seconds,
           "images_per_sec": batch / seconds, "seconds_per_image": seconds / batch,
           "ms_per_position": seconds / D * 1e3, "faults_per_call": float(np.mean(faults)) if len(faults) else None,
           "step_ms_first": lat[0] * 1e3, "step_ms_last": lat[-1] * 1e3}
    at = dict(zip(positions, lat))
    probes = [p for p in probe_positions if p in at]
    if len(probes) == 2:      # latency growth, e.g. step at position 3000 over step at 100
        row["latency_growth"] = at[probes[1]] / at[probes[0]]
    return row


def kv_cache_bytes(model_cfg, info, batch, dtype=torch.float32):
    return batch * model_cfg.n_layers * info.length * 2 * model_cfg.d_model * dtype.itemsize


def timed_positions(D, n, probes=()):
    """n evenly spaced positions over 0..D-1, plus the probe positions that exist."""
    return sorted({int(p) for p in np.linspace(0, D - 1, n)} | {p for p in probes if p < D})


def skip_reason(cfg, model_cfg, info, model, name, attention, sampler, batch, dtype):
    """Why this batch cannot be measured in this precision (a sentence), or None."""
    if attention == "softmax" and sampler == "step":
        cache_dtype = model.blocks[0].attn.init_state(0, 0, "cpu", dtype).k.dtype
        if kv_cache_bytes(model_cfg, info, batch, cache_dtype) > cfg.sampling.max_cache_gb * 2 ** 30:
            return f"KV cache over {cfg.sampling.max_cache_gb} GiB"
    try:
        check_batch_fits(model, batch, sampler, torch.device("cpu"))
    except UserError as e:
        return str(e)
    return None


def run(cfg, model_cfg, info, out_dir=None, out_name="sampling"):
    """cfg: the bench config (a BenchConfig, or a dict of one; its options: cfg.sampling); model_cfg: architecture
    (a ModelConfig, or a dict of one; attention swapped per method). With out_dir: the plan first, and
    out_dir/out_name.json and .md rewritten after every batch size."""
    cfg, model_cfg = typed(BenchConfig, cfg), typed(ModelConfig, model_cfg)
    s = cfg.sampling
    torch.manual_seed(cfg.seed)
    positions = timed_positions(info.length, s.n_positions, s.probe_positions)
    precisions, note = resolve_precisions(s.precisions, torch.device("cpu"), "sampling.precisions")
    if note:
        print(note)
    results, curves = [], {p: {} for p in precisions}

    def render(rows):
        result = summarize(rows, positions, precisions, curves)
        payload = {"config": plain(cfg), "machine": machine(), **result}
        return payload, report(result, cfg, cfg.arch_name, info, model_cfg)

    def batches_of(name):
        return s.step_batches if METHODS[name][1] == "step" else s.recompute_batches
    cases = [f"{name} batch {b}" for name in s.methods for b in batches_of(name)]
    progress = Progress(out_dir, out_name, cases, render, cfg.quick) if out_dir is not None else None
    for name in s.methods:
        attention, sampler = METHODS[name]
        options = s.lsh_options if attention == "lsh" else ({"impl": "auto"} if attention == "linear" else {})
        model = build_model({**plain(model_cfg), "attention": attention, "attention_options": options}, info).eval()
        batches = batches_of(name)
        if name == "softmax-kv-cache-bf16":
            for block in model.blocks:
                block.attn.bf16_cache = True
        ours = [p for p in precisions if name != "softmax-kv-cache-bf16" or p == "bfloat16"]
        for batch in batches:
            todo = []
            for precision in ours:
                reason = skip_reason(cfg, model_cfg, info, model, name, attention, sampler, batch,
                                     precision_dtype(precision))
                if reason:
                    print(f"{name}: skipping batch {batch} in {precision} ({reason})")
                else:
                    todo.append(precision)
            lat, faults = {p: [] for p in todo}, {p: [] for p in todo}
            for t in positions:                  # the precisions in turn at each position
                for p in todo:
                    lat[p].append(latency(model, sampler, batch, t, s.reps, precision_dtype(p), faults[p]))
            whole = {p: whole_image_seconds(model, cfg.seed, precision_dtype(p))
                     for p in todo if sampler == "step" and batch == 1}
            lines = []
            for precision in todo:
                row = row_of(name, precision, batch, positions, lat[precision], model.length, s.probe_positions,
                             faults[precision])
                if precision in whole:
                    row["whole_image_seconds"] = whole[precision]
                if name == "linear-recurrent":              # constant work per step: one limit for all positions
                    step = float(np.mean(lat[precision]))
                    row["limit_share"] = limit_share(model, batch, step, precision_dtype(precision))
                results.append(row)
                curves[precision][(name, batch)] = lat[precision]
                lines.append(f"{name:18s} {precision:8s} batch {batch:5d}: {row['images_per_sec']:10.4f} images/s "
                             f"(step {row['step_ms_first']:.2f} -> {row['step_ms_last']:.2f} ms)")
            if progress:
                progress.rows = results
                progress.case_done("; ".join(lines) or f"{name} batch {batch}: skipped")
                if results:
                    progress.write(partial=True, quiet=True)
            else:
                for line in lines:
                    print(line, flush=True)
    if not results:
        raise UserError("every batch size was skipped (see the lines above), so there is nothing to report; add "
                        "smaller sampling.step_batches or sampling.recompute_batches, or raise sampling.max_cache_gb.")
    return summarize(results, positions, precisions, curves)


def summarize(results, positions, precisions, curves):
    """The result dict of `run`: every row, the best batch per method and precision with its ratios,
    and the latency curves."""
    best = {}
    for row in results:
        key = (row["method"], row["precision"])
        if key not in best or row["images_per_sec"] > best[key]["images_per_sec"]:
            best[key] = row
    summary = []
    for (name, precision), row in best.items():
        same = [r for r in best.values() if r["precision"] == precision]
        linear = best.get(("linear-recurrent", precision))
        f32 = best.get((name, "float32"))
        b1 = next((r for r in results if r["method"] == name and r["precision"] == precision and r["batch"] == 1),
                  None)
        b1_f32 = next((r for r in results if r["method"] == name and r["precision"] == "float32" and r["batch"] == 1),
                      None)
        whole = b1.get("whole_image_seconds") if b1 else None
        whole_f32 = b1_f32.get("whole_image_seconds") if b1_f32 else None
        summary.append({**row, "speedup_vs_slowest": row["images_per_sec"] / min(r["images_per_sec"] for r in same),
                        "linear_speedup": linear["images_per_sec"] / row["images_per_sec"] if linear else None,
                        "vs_float32": row["images_per_sec"] / f32["images_per_sec"] if f32 else None,
                        "batch1_seconds_per_image": b1["seconds_per_batch"] if b1 else None,
                        "batch1_whole_image_seconds": whole,
                        "batch1_whole_vs_float32": whole_f32 / whole if whole and whole_f32 else None})
    first = precisions[0]   # `curves` (the latency plot) keeps its old form, for the first precision
    return {"results": results, "best": summary, "positions": positions, "precisions": precisions,
            "curves": {f"{m}@{b}": lat for (m, b), lat in curves[first].items()},
            "precision_curves": {p: {f"{m}@{b}": lat for (m, b), lat in c.items()} for p, c in curves.items()}}


def report(result, cfg, arch_name, info, model_cfg):
    cols = [("method", "method", None), ("precision", "precision", None), ("batch", "best batch", None),
            ("images_per_sec", "images/sec", "{:.4g}"), ("vs_float32", "x float32", "{:.2f}"),
            ("speedup_vs_slowest", "x slowest", "{:.1f}"), ("linear_speedup", "linear is x faster", "{:.1f}"),
            ("batch1_seconds_per_image", "batch-1 s/image (estimate)", "{:.3g}"),
            ("batch1_whole_image_seconds", "batch-1 s/image (one whole image)", "{:.3g}"),
            ("batch1_whole_vs_float32", "one whole image x float32", "{:.2f}"),
            ("step_ms_first", "step ms @0", "{:.2f}"), ("step_ms_last", "step ms @D-1", "{:.2f}"),
            ("ms_per_position", "ms / position (batch)", "{:.3f}"), ("faults_per_call", "page faults / step", "{:.0f}"),
            ("latency_growth", "step latency @" + "/@".join(map(str, cfg.sampling.probe_positions[::-1])),
             "{:.2f}"),
            ("limit_share", "share of limit", "{:.0%}")]
    header = (f"Sampling speed, {arch_name} architecture ({model_cfg.n_layers} layers, d_model "
              f"{model_cfg.d_model}, {model_cfg.n_heads} heads, {info.length} sub-pixels), "
              f"{' and '.join(result['precisions'])} products (x slowest, linear is x faster: within one precision; "
              f"share of limit: the RNN step's time against its products at this CPU's measured FLOP/s plus its "
              f"weights and state at the measured bandwidth, benchmarks/step_limit.py; ms / position: the batch's "
              f"seconds over its D positions; page faults / step: minor faults (getrusage) per timed step, ~0 once "
              f"memory is reused).\n"
              f"Machine: {machine()}.\n\n")
    md = header + markdown_table(result["best"], cols)
    per_batch = [("method", "method", None), ("precision", "precision", None), ("batch", "batch", None),
                 cols[3]] + cols[10:]
    md += "\n\nAll batch sizes:\n\n" + markdown_table(result["results"], per_batch)
    return md


def plot_latency(path, result, batch, log=False, title="Per-step latency against position"):
    """Per-step latency of the step samplers against position at `batch`, or at the measured batch
    nearest to it for each method (named in the legend and printed); returns the path written, or
    None after printing why no plot could be drawn."""
    measured = {}
    for key in result["curves"]:
        method, b = key.rsplit("@", 1)
        if METHODS[method][1] == "step":
            measured.setdefault(method, []).append(int(b))
    if not measured:
        print(f"no latency plot: no step sampler ({', '.join(m for m, (_, s) in METHODS.items() if s == 'step')}) "
              f"was measured")
        return None
    nearest = {m: min(bs, key=lambda b: (abs(b - batch), b)) for m, bs in measured.items()}  # smaller on a tie
    series = {f"{m}, batch {b}": (result["positions"], [x * 1e3 for x in result["curves"][f"{m}@{b}"]])
              for m, b in nearest.items()}
    moved = [f"{m} at batch {b}" for m, b in nearest.items() if b != batch]
    if moved:
        print(f"latency plot: plot_batch {batch} was not measured for every step sampler; drawing the nearest "
              f"measured batch: {', '.join(moved)}")
    used = set(nearest.values())
    at = f"batch {used.pop()}" if len(used) == 1 else f"nearest measured batches to {batch}"
    return plots.line_chart(path, series, f"{title} ({at})", "position t", "ms per step", log=log)
