"""Causal attention and whole-model training-step benchmarks (issue: kernels).

Times are medians over `repeat` runs after a warm-up, all implementations timed in this
process with the same inputs and threads, so ratios are like for like. Peak memory of one
forward+backward is measured in a fresh subprocess per case (CPU: the rise of the process's
peak resident memory (VmHWM, reset after making the inputs); CUDA: max_memory_allocated).
"""
import json
import subprocess
import sys

import torch
import torch.nn.functional as F

from ..data.sets import dataset_info
from ..errors import UserError
from ..model.transformer import build_model
from ..attention.feature_maps import FEATURE_MAPS, make_feature_map
from ..config import BenchConfig, plain, typed
from ..ops import (TRITON_DEVICES, gated_linear_attention, kernel_error, linear_attention, mapped_linear_attention,
                   triton_error)
from ..dtypes import autocast
from ..precision import FLOAT_PRECISIONS, resolve_precisions
from .progress import Progress
from .report import markdown_table, machine
from .timing import backward_over_forward, median_ms, sync, time_all

LINEAR_IMPLS = ("cumsum", "chunked", "kernel", "triton", "auto")


def parse_map(spec):
    """A feature_maps entry, "NAME[:F][+gate]" (elu, favor:128, rff+gate, ...) -> the linear
    attention's options {feature_map, n_features?, gate?}."""
    body, _, gate = spec.partition("+")
    name, _, n = body.partition(":")
    if name not in FEATURE_MAPS or gate not in ("", "gate") or (n and not n.isdigit()):
        raise UserError(f"bad feature_maps entry {spec!r}; write NAME[:N_FEATURES][+gate] with NAME one of "
                        f"{', '.join(FEATURE_MAPS)}, e.g. favor:128 or elu+gate.")
    options = {"feature_map": name}
    if n:
        options["n_features"] = int(n)
    if gate:
        options["gate"] = "input"
    return options


def n_features(spec, E):
    """F, the features per head of a feature_maps entry (E for softmax "-" and the maps without a draw)."""
    if spec == "-":
        return E
    options = parse_map(spec)
    cls = FEATURE_MAPS[options["feature_map"]]
    return options.get("n_features", cls.default_features) if cls.random else E


def attention_fn(impl, spec="elu", H=1, E=1, device="cpu"):
    """The causal attention of one implementation on (q, k, v) of shape (N, H, L, E); for linear
    impls with the feature map (and gate) of `spec` (see `parse_map`): the map's features (and a
    fixed gate of the paper's form) computed inside, as the model computes them."""
    if impl == "softmax":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    options = parse_map(spec)
    if options == {"feature_map": "elu"}:
        return lambda q, k, v: linear_attention(q, k, v, impl=impl)
    torch.manual_seed(0)
    phi = make_feature_map(options["feature_map"], H, E, options.get("n_features")).to(device)
    if "gate" not in options:
        return lambda q, k, v: mapped_linear_attention(phi(q), phi(k), v, impl=impl)

    def gated(q, k, v):
        a = torch.linspace(1.0, 6.0, q.shape[2], device=q.device).expand(q.shape[:3])   # gate logits (N, H, L)
        return gated_linear_attention(phi(q), phi(k) * torch.sigmoid(-a)[..., None], v, F.logsigmoid(a), impl=impl)
    return gated


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def inputs(N, H, L, E, device, dtype="float32", seed=0):
    """q, k, v (N, H, L, E) needing gradients, and a fixed gradient of the output to run the
    backward from (not out.sum(), whose own backward would be timed with it)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(N, H, L, E, generator=g).to(device, DTYPES[dtype]) for _ in range(4))
    return [t.requires_grad_() for t in (q, k, v)], grad


def time_case(impl, spec, N, H, L, E, device, dtype, repeat):
    """{fwd_ms, fwd_bwd_ms: medians; fwd_faults, fwd_bwd_faults: minor page faults per call}."""
    (q, k, v), grad = inputs(N, H, L, E, device, dtype)
    f = attention_fn(impl, spec, H, E, device)

    def fwd():
        with torch.no_grad():
            f(q, k, v)

    def fwd_bwd():
        torch.autograd.grad(f(q, k, v), (q, k, v), grad)
    faults = {}
    ms = {**time_all({"fwd": fwd}, device, repeat, faults), **time_all({"fwd_bwd": fwd_bwd}, device, repeat, faults)}
    return {"fwd_ms": ms["fwd"], "fwd_bwd_ms": ms["fwd_bwd"], "fwd_faults": faults["fwd"],
            "fwd_bwd_faults": faults["fwd_bwd"]}


def peak_memory_child(impl, N, H, L, E, device, dtype, spec="elu"):
    """Runs in a subprocess: bytes of peak memory one forward+backward adds."""
    device = torch.device(device)
    (q, k, v), grad = inputs(N, H, L, E, device, dtype)
    f = attention_fn(impl, spec, H, E, device)
    return peak_bytes(lambda: torch.autograd.grad(f(q, k, v), (q, k, v), grad), device)


def peak_bytes(fn, device):
    """Bytes of peak memory that calling fn() adds: CUDA's allocator statistics, or on the CPU this
    process's VmHWM (ru_maxrss survives exec and would carry the parent's peak; VmHWM is this
    process's own and can be reset to the current resident size through clear_refs)."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    base = hwm_bytes()
    fn()
    return hwm_bytes() - base


def hwm_bytes():
    """Peak resident memory of this process (VmHWM) in bytes."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


def peak_memory(impl, N, H, L, E, device, dtype, threads, spec="elu"):
    return in_child(f"peak_memory_child({impl!r}, {N}, {H}, {L}, {E}, {str(device)!r}, {dtype!r}, {spec!r})",
                    threads, f"{impl} at L={L}")


def in_child(call, threads, what):
    """The number `call` (an expression over this module's functions) returns in a fresh Python
    process, whose peak memory is its own; None, with a line saying why, when it fails."""
    code = ("import json, torch; from imagegen.benchmarks import attention; "
            f"torch.set_num_threads({threads}); print(json.dumps(attention.{call}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode:
        print(f"peak memory of {what} not measured: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def train_step_peak_child(model_cfg, name, L, batch, precision, device):
    """Runs in a subprocess: bytes of peak memory one training step adds to the model and the batch
    (activations, gradients, AdamW's two moments), the first step of a fresh process."""
    device = torch.device(device)
    return peak_bytes(training_step(model_cfg, name, L, batch, precision, device), device)


def training_step(model_cfg, name, L, batch, precision, device):
    """One optimizer step (forward, backward, AdamW) of a fresh model on a random (batch, L) batch, as a function."""
    torch.manual_seed(0)
    model = build_model(model_cfg, dataset_info(name)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 256, (batch, L), dtype=torch.uint8, device=device)

    def step():
        with autocast(device, precision == "bfloat16"):
            loss = model.nll(x).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def attention_cases(c, impls):
    """The (dtype, L, impl) cases of mode=attention, in the order they are timed."""
    a = c.attention
    return [(dtype, L, impl) for dtype in a.dtypes for L in a.lengths for impl in impls]


def run_attention(c, device, out_dir=None):
    """Time every case; with out_dir, the plan first and the table and JSON rewritten there row by
    row (`progress.Progress`). -> ({"rows": rows}, markdown). c: a BenchConfig (or a dict of one); its options:
    c.attention."""
    c = typed(BenchConfig, c)
    a = c.attention
    N, H, E = a.batch, a.heads, a.head_dim
    impls = [i for i in a.impls if i == "softmax" or i in LINEAR_IMPLS]
    if "kernel" in impls and kernel_error(device.type, warn=True) is not None:
        impls.remove("kernel")
    if "triton" in impls and (device.type not in TRITON_DEVICES or triton_error(device.type, warn=True) is not None):
        impls.remove("triton")                    # Triton rows on CUDA only (the CPU runs it interpreted, for tests)
    unknown = [d for d in a.dtypes if d not in DTYPES]
    if unknown:
        raise UserError(f"unknown dtype {unknown[0]!r} in attention.dtypes; use {' or '.join(DTYPES)}.")
    specs = a.feature_maps or ["elu"]
    for spec in specs:
        parse_map(spec)                                                   # bad entries fail before any timing
    memory = not c.quick                          # quick: no subprocess per case for its peak memory
    cols = [("dtype", "dtype", None), ("L", "N (length)", None), ("impl", "impl", None), ("map", "feature map", None),
            ("fwd_ms", "fwd ms", "{:.2f}"), ("fwd_bwd_ms", "fwd+bwd ms", "{:.2f}"),
            ("bwd_over_fwd", "bwd / fwd", "{:.2f}"),
            ("fwd_us_per_position", "fwd us / position", "{:.3f}"),
            ("fwd_bwd_us_per_position", "fwd+bwd us / position", "{:.3f}"),
            ("fwd_faults", "page faults / fwd", "{:.0f}"), ("fwd_bwd_faults", "page faults / fwd+bwd", "{:.0f}"),
            ("speedup_fwd_bwd", "fwd+bwd speedup vs softmax", "{:.1f}x"),
            ("peak_mib", "peak MiB (fwd+bwd)", "{:.1f}"), ("memory_vs_softmax", "memory / softmax", "{:.2f}"),
            ("note", "note", None)]

    def render(rows):
        for row in rows:
            soft = next((r for r in rows if r["dtype"] == row["dtype"] and r["L"] == row["L"]
                         and r["impl"] == "softmax" and "fwd_ms" in r), None)
            if soft and "fwd_ms" in row:
                row["speedup_fwd_bwd"] = soft["fwd_bwd_ms"] / row["fwd_bwd_ms"]
                if soft.get("peak_mib") and row.get("peak_mib"):
                    row["memory_vs_softmax"] = row["peak_mib"] / soft["peak_mib"]
        md = (f"Causal attention, B={N}, H={H}, D=M={E}, {' and '.join(a.dtypes)}, {device}. softmax = "
              f"scaled_dot_product_attention(is_causal=True) (flash on CUDA); linear: normalised, with the feature map "
              f"named (F features; +gate: random feature attention's gate, chunked form), its features computed in "
              f"the timed call. bwd / fwd = (fwd+bwd - fwd) / fwd, the backward run from a fixed random gradient "
              f"of the output. us / position: a call's time over its B x L positions (flat across lengths for a "
              f"linear attention); page faults: minor faults (getrusage) per timed call, ~0 once memory is reused."
              f"{'' if memory else ' quick: peak memory not measured.'}\n"
              f"Machine: {machine()}.\n\n" + markdown_table(rows, cols))
        return {"config": plain(c), "machine": machine(), "rows": rows}, md

    cases = [(dtype, L, impl, spec) for dtype, L, impl in attention_cases(c, impls)
             for spec in (["-"] if impl == "softmax" else specs)
             if not (spec != "-" and "gate" in parse_map(spec) and impl not in ("chunked", "auto"))]  # gate: chunked
    names = [f"{d} L={L} {i}" + ("" if m in ("-", "elu") else f" {m}") for d, L, i, m in cases]
    progress = Progress(out_dir, "attention", names, render,
                        c.quick) if out_dir is not None else None
    rows = []
    for dtype, L, impl, spec in cases:
        cumsum_gb = 4 * N * H * L * n_features(spec, E) * (E + 1) * 4 / 2 ** 30   # states, grads, temporaries
        base = {"dtype": dtype, "L": L, "impl": impl, "map": spec}
        if impl == "cumsum" and cumsum_gb > a.cumsum_max_gb:
            row = {**base, "note": f"skipped: needs ~{cumsum_gb:.0f} GiB"}
            line = f"{dtype} L={L:6d} {impl:8s} {spec:12s} {row['note']}"
        else:
            timing = time_case(impl, spec, N, H, L, E, device, dtype, a.repeat)
            fwd, fwd_bwd = timing["fwd_ms"], timing["fwd_bwd_ms"]
            mem = peak_memory(impl, N, H, L, E, device, dtype, torch.get_num_threads(), spec) if memory else None
            row = {**base, **timing, "bwd_over_fwd": backward_over_forward(fwd, fwd_bwd),
                   "fwd_us_per_position": fwd * 1e3 / (N * L), "fwd_bwd_us_per_position": fwd_bwd * 1e3 / (N * L),
                   "peak_mib": None if mem is None else mem / 2 ** 20}
            line = (f"{dtype} L={L:6d} {impl:8s} {spec:12s} fwd {fwd:10.2f} ms  fwd+bwd {fwd_bwd:10.2f} ms  "
                    f"faults/call {timing['fwd_faults']:.0f} {timing['fwd_bwd_faults']:.0f}  "
                    f"peak {row['peak_mib'] or float('nan'):9.1f} MiB")
        rows.append(row)
        if progress:
            progress.row(row, line)
        else:
            print(line, flush=True)
    payload, md = render(rows)
    return {"rows": payload["rows"]}, md


def run_train_step(c, device, out_dir=None):
    """One optimizer step of the whole model (the configured architecture) per length,
    precision (float32, or bfloat16 autocast as train.bf16 runs it) and attention, with memory set
    up as every command sets it (commands.cli.resolve_device); with out_dir, the plan first and rows
    written as they come. c: a BenchConfig (or a dict of one); its options: c.train_step."""
    c = typed(BenchConfig, c)
    t = c.train_step
    precisions, note = resolve_precisions(t.precisions, device, "train_step.precisions", FLOAT_PRECISIONS)
    if note:
        print(note)
    specs = t.feature_maps or ["elu"]
    variants = [("softmax", "softmax", {})] + [("linear" if spec == "elu" else f"linear {spec}", "linear",
                                                {"impl": "auto", **parse_map(spec)}) for spec in specs]
    cols = [("data", "data", None), ("length", "length", None), ("precision", "precision", None),
            ("attention", "attention", None), ("step_ms", "ms / training step", "{:.1f}"),
            ("speedup", "speedup vs softmax", "{:.2f}x"), ("peak_mib", "peak MiB (step)", "{:.0f}"),
            ("memory_vs_softmax", "memory / softmax", "{:.2f}")]

    def render(rows):
        for row in rows:
            soft = next((r for r in rows if r["data"] == row["data"] and r["precision"] == row["precision"]
                         and r["attention"] == "softmax"), None)
            if soft:
                row["speedup"] = soft["step_ms"] / row["step_ms"]
                if soft.get("peak_mib") and row.get("peak_mib"):
                    row["memory_vs_softmax"] = row["peak_mib"] / soft["peak_mib"]
        md = (f"Whole-model training step (forward, backward, AdamW), {c.model.n_layers} layers, d_model "
              f"{c.model.d_model}, batch {t.batch}, float32 or bfloat16 autocast, {device}.\n"
              f"Machine: {machine()}.\n\n" + markdown_table(rows, cols))
        return {"config": plain(c), "machine": machine(), "rows": rows}, md

    cases = [(name, L, precision, variant) for name, L in t.lengths.items() for precision in precisions
             for variant in variants]
    progress = Progress(out_dir, "train_step", [f"{n} L={L} {p} {v[0]}" for n, L, p, v in cases], render,
                        c.quick) if out_dir is not None else None
    rows = []
    memory = not c.quick                          # quick: no subprocess per case for its peak memory
    for name, L, precision, (label, attention, options) in cases:
        model_cfg = {**plain(c.model), "attention": attention, "attention_options": options}
        step = training_step(model_cfg, name, L, t.batch, precision, device)
        mem = in_child(f"train_step_peak_child({model_cfg!r}, {name!r}, {L}, {t.batch}, {precision!r}, "
                       f"{str(device)!r})", torch.get_num_threads(), f"{label} at L={L}") if memory else None
        rows.append({"data": name, "length": L, "precision": precision, "attention": label,
                     "step_ms": median_ms(step, device, t.repeat),
                     "peak_mib": None if mem is None else mem / 2 ** 20})
        del step
        line = f"{name} L={L} {precision} {label:18s} {rows[-1]['step_ms']:.1f} ms/step"
        if progress:
            progress.row(rows[-1], line)
        else:
            print(line, flush=True)
    payload, md = render(rows)
    return {"rows": payload["rows"]}, md
