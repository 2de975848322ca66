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

from ..data import dataset_info
from ..allocator import keep_freed_memory
from ..errors import UserError
from ..model import build_model
from ..ops import TRITON_DEVICES, kernel_error, linear_attention, triton_error
from ..precision import autocast, resolve_precisions
from .progress import Progress
from .report import markdown_table, machine
from .timing import median_ms, sync

LINEAR_IMPLS = ("cumsum", "chunked", "kernel", "triton", "auto")


def attention_fn(impl):
    """The causal attention of one implementation on (q, k, v) of shape (N, H, L, E)."""
    if impl == "softmax":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return lambda q, k, v: linear_attention(q, k, v, impl=impl)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def inputs(N, H, L, E, device, dtype="float32", seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(N, H, L, E, generator=g).to(device, DTYPES[dtype]).requires_grad_() for _ in range(3)]


def time_case(impl, N, H, L, E, device, dtype, repeat):
    q, k, v = inputs(N, H, L, E, device, dtype)
    f = attention_fn(impl)

    def fwd():
        with torch.no_grad():
            f(q, k, v)

    def fwd_bwd():
        out = f(q, k, v)
        torch.autograd.grad(out.sum(), (q, k, v))
    return median_ms(fwd, device, repeat), median_ms(fwd_bwd, device, repeat)


def peak_memory_child(impl, N, H, L, E, device, dtype):
    """Runs in a subprocess: bytes of peak memory one forward+backward adds."""
    device = torch.device(device)
    q, k, v = inputs(N, H, L, E, device, dtype)
    f = attention_fn(impl)
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        torch.autograd.grad(f(q, k, v).sum(), (q, k, v))
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    # ru_maxrss survives exec (it would carry the parent's peak); VmHWM is this process's own and
    # can be reset to the current resident size through clear_refs.
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    base = hwm_bytes()
    torch.autograd.grad(f(q, k, v).sum(), (q, k, v))
    return hwm_bytes() - base


def hwm_bytes():
    """Peak resident memory of this process (VmHWM) in bytes."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


def peak_memory(impl, N, H, L, E, device, dtype, threads):
    code = ("import json, sys, torch; from imagegen.benchmarks.attention import peak_memory_child; "
            f"torch.set_num_threads({threads}); "
            f"print(json.dumps(peak_memory_child({impl!r}, {N}, {H}, {L}, {E}, {str(device)!r}, {dtype!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode:
        print(f"peak memory of {impl} at L={L} not measured: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def attention_cases(c, impls):
    """The (dtype, L, impl) cases of mode=attention, in the order they are timed."""
    return [(dtype, L, impl) for dtype in c["attention_dtypes"] for L in c["lengths"] for impl in impls]


def run_attention(c, device, out_dir=None):
    """Time every case; with out_dir, the plan first and the table and JSON rewritten there row by
    row (`progress.Progress`). -> ({"rows": rows}, markdown)."""
    N, H, E = c["batch"], c["heads"], c["head_dim"]
    if device.type == "cpu":     # malloc as imagegen-train sets it: past ~8k positions the gradients
        keep_freed_memory()      # are >= 32 MB, which glibc would mmap afresh and fault in every call
    impls = [i for i in c["impls"] if i == "softmax" or i in LINEAR_IMPLS]
    if "kernel" in impls and kernel_error(device.type, warn=True) is not None:
        impls.remove("kernel")
    if "triton" in impls and (device.type not in TRITON_DEVICES or triton_error(device.type, warn=True) is not None):
        impls.remove("triton")                    # Triton rows on CUDA only (the CPU runs it interpreted, for tests)
    unknown = [d for d in c["attention_dtypes"] if d not in DTYPES]
    if unknown:
        raise UserError(f"unknown dtype {unknown[0]!r} in attention_dtypes; use {' or '.join(DTYPES)}.")
    memory = not c.get("quick")                   # quick: no subprocess per case for its peak memory
    cols = [("dtype", "dtype", None), ("L", "N (length)", None), ("impl", "impl", None), ("fwd_ms", "fwd ms", "{:.2f}"),
            ("fwd_bwd_ms", "fwd+bwd ms", "{:.2f}"), ("bwd_over_fwd", "bwd / fwd", "{:.2f}"),
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
        md = (f"Causal attention, B={N}, H={H}, D=M={E}, {' and '.join(c['attention_dtypes'])}, {device}. softmax = "
              f"scaled_dot_product_attention(is_causal=True) (flash on CUDA); linear = elu+1 features, normalised. "
              f"bwd / fwd = (fwd+bwd - fwd) / fwd.{'' if memory else ' quick: peak memory not measured.'}\n"
              f"Machine: {machine()}.\n\n" + markdown_table(rows, cols))
        return {"config": c, "machine": machine(), "rows": rows}, md

    cases = attention_cases(c, impls)
    progress = Progress(out_dir, "attention", [f"{d} L={L} {i}" for d, L, i in cases], render, c.get("quick")) \
        if out_dir is not None else None
    rows = []
    for dtype, L, impl in cases:
        cumsum_gb = 4 * N * H * L * E * (E + 1) * 4 / 2 ** 30      # states, their grads and temporaries
        if impl == "cumsum" and cumsum_gb > c["cumsum_max_gb"]:
            row = {"dtype": dtype, "L": L, "impl": impl, "note": f"skipped: needs ~{cumsum_gb:.0f} GiB"}
            line = f"{dtype} L={L:6d} {impl:8s} {row['note']}"
        else:
            fwd, fwd_bwd = time_case(impl, N, H, L, E, device, dtype, c["repeat"])
            mem = peak_memory(impl, N, H, L, E, device, dtype, torch.get_num_threads()) if memory else None
            row = {"dtype": dtype, "L": L, "impl": impl, "fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd,
                   "bwd_over_fwd": (fwd_bwd - fwd) / fwd, "peak_mib": None if mem is None else mem / 2 ** 20}
            line = (f"{dtype} L={L:6d} {impl:8s} fwd {fwd:10.2f} ms  fwd+bwd {fwd_bwd:10.2f} ms  "
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
    precision (float32, or bfloat16 autocast as train.bf16 runs it) and attention, with malloc set
    up as imagegen-train sets it; with out_dir, the plan first and rows written as they come."""
    if device.type == "cpu":
        keep_freed_memory()
    precisions, note = resolve_precisions(c["train_precisions"], device, "train_precisions")
    if note:
        print(note)
    cols = [("data", "data", None), ("length", "length", None), ("precision", "precision", None),
            ("attention", "attention", None), ("step_ms", "ms / training step", "{:.1f}"),
            ("speedup", "speedup vs softmax", "{:.2f}x")]

    def render(rows):
        for row in rows:
            soft = next((r for r in rows if r["data"] == row["data"] and r["precision"] == row["precision"]
                         and r["attention"] == "softmax"), None)
            if soft:
                row["speedup"] = soft["step_ms"] / row["step_ms"]
        md = (f"Whole-model training step (forward, backward, AdamW), {c['model']['n_layers']} layers, d_model "
              f"{c['model']['d_model']}, batch {c['train_batch']}, float32 or bfloat16 autocast, {device}.\n"
              f"Machine: {machine()}.\n\n" + markdown_table(rows, cols))
        return {"config": c, "machine": machine(), "rows": rows}, md

    cases = [(name, L, precision, attention) for name, L in c["train_lengths"].items() for precision in precisions
             for attention in ("softmax", "linear")]
    progress = Progress(out_dir, "train_step", [f"{n} L={L} {p} {a}" for n, L, p, a in cases], render,
                        c.get("quick")) if out_dir is not None else None
    rows = []
    for name, L, precision, attention in cases:
        info = dataset_info(name)
        torch.manual_seed(0)
        options = {"impl": "auto"} if attention == "linear" else {}
        model = build_model({**c["model"], "attention": attention, "attention_options": options}, info).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(0, 256, (c["train_batch"], L), dtype=torch.uint8, device=device)

        def step():
            with autocast(device, precision == "bfloat16"):
                loss = model.nll(x).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        rows.append({"data": name, "length": L, "precision": precision, "attention": attention,
                     "step_ms": median_ms(step, device, c["repeat"])})
        line = f"{name} L={L} {precision} {attention:8s} {rows[-1]['step_ms']:.1f} ms/step"
        if progress:
            progress.row(rows[-1], line)
        else:
            print(line, flush=True)
    payload, md = render(rows)
    return {"rows": payload["rows"]}, md
