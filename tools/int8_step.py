"""The small-batch products of decoding at 1, 2 and 4 rows: float32 in panels (the C++ kernel's
decode_linear), 8-bit weights through the C++ kernel's own int8 product (decode_linear_int8:
x quantized per row, int32 sums, AVX512-VNNI or AVX2 where the CPU has it; --form avx2
forces the AVX2 form, as an AVX2-only CPU runs it), and through torch's fbgemm
dynamic quantized linear (`imagegen.ops.int8.linear_int8`, what precision=int8 runs today).

    python -m tools.int8_step --out bench/int8_step.json     # about a minute
    python -m tools.int8_step --steps mnist-linear cifar10-linear --rounds 7 --out bench/int8_steps.json

    python -m tools.int8_step --steps mnist-linear cifar10-linear --generate 64 --rounds 3 \
        --out bench/int8_generate.json

--steps times whole decoding steps of shipped models instead, at batches 1, 16, 64, 256 (`step_calls`):
float32, and int8 through the one-call C++ step, the Python module loop with the kernel's products and the
module loop with fbgemm's, the choice `sampling.plan.int8_one_call` makes (CPU time, one thread);
with --generate B, whole images sampled B at a time (no guidance) at float32 and int8, end to end.

One torch thread, in one process; per shape and batch the three products are timed in turns
(--rounds short rounds of --calls calls each, interleaved so that a busy neighbour slows them alike;
short, so that on a busy machine some rounds run unpreempted), and
each keeps its best round: microseconds per call, with the ratios float32 / int8 kernel and fbgemm /
int8 kernel (above 1: the int8 kernel is faster). Shapes: (256, 768), (256, 1024), (1024, 256) and
paper_cifar's per-block set (qkv 256 -> 768, out 256 -> 256, ff1 256 -> 1024, ff2 1024 -> 256), whose
sum row is one block's four products. Writes the table as markdown and the rows as JSON.
"""
import argparse
import os
import time

import torch

from imagegen.benchmarks.report import machine, markdown_table, write_outputs
from imagegen.errors import one_line

SHAPES = [("256->768", 256, 768), ("256->1024", 256, 1024), ("1024->256", 1024, 256)]
# paper_cifar (conf/preset/paper_cifar.yaml: d_model 256, d_ff 1024): one block's products
PAPER_CIFAR = [("qkv", 256, 768), ("out", 256, 256), ("ff1", 256, 1024), ("ff2", 1024, 256)]
BATCHES = (1, 2, 4)
PRODUCTS = ("float32", "int8_kernel", "fbgemm")


def products(d_in, d_out, batch, seed=0):
    """{name: a call with no arguments} for the three products of one shape and batch."""
    from imagegen.ops.build import load_kernel
    from imagegen.ops.int8 import asked_form, linear_int8, pack_int8, quantize
    from imagegen.ops.layout import panels
    kernel = load_kernel("cpu")
    g = torch.Generator().manual_seed(seed)
    w, b = torch.randn(d_in, d_out, generator=g) * 0.05, torch.randn(d_out, generator=g) * 0.1
    x = torch.randn(batch, d_in, generator=g)
    laid_out, packed, fbgemm = panels(w), pack_int8(w), quantize(w, b)
    return {"float32": lambda: kernel.decode_linear(x, laid_out, b),
            "int8_kernel": lambda: kernel.decode_linear_int8(x, *packed, b, asked_form()),
            "fbgemm": lambda: linear_int8(x, fbgemm)}


def time_interleaved(calls, rounds, per_round, clock=time.perf_counter):
    """{name: best microseconds per call} of each call, timed in turns, round by round, on `clock`."""
    best = {name: float("inf") for name in calls}
    for fn in calls.values():                            # warm up
        for _ in range(per_round):
            fn()
    for _ in range(rounds):
        for name, fn in calls.items():
            start = clock()
            for _ in range(per_round):
                fn()
            best[name] = min(best[name], (clock() - start) / per_round * 1e6)
    return best


def measure(rounds=30, per_round=40):
    """The rows of the table: one per shape and batch, and per batch paper_cifar's block sum."""
    rows = []
    for group, shapes in (("shapes", SHAPES), ("paper_cifar", PAPER_CIFAR)):
        for batch in BATCHES:
            block = {p: 0.0 for p in PRODUCTS}
            for name, d_in, d_out in shapes:
                us = time_interleaved(products(d_in, d_out, batch), rounds, per_round)
                rows.append({"group": group, "product": name, "d_in": d_in, "d_out": d_out, "batch": batch,
                             **{f"{p}_us": us[p] for p in PRODUCTS}})
                for p in PRODUCTS:
                    block[p] += us[p]
            if group == "paper_cifar":
                rows.append({"group": group, "product": "block (sum)", "d_in": None, "d_out": None,
                             "batch": batch, **{f"{p}_us": block[p] for p in PRODUCTS}})
    for row in rows:
        row["float32_over_int8"] = row["float32_us"] / row["int8_kernel_us"]
        row["fbgemm_over_int8"] = row["fbgemm_us"] / row["int8_kernel_us"]
    return rows


STEP_BATCHES = (1, 16, 64, 256)
STEPS = ("float32", "int8_one_call", "int8_loop_kernel", "int8_loop_fbgemm")


def step_calls(model, batch):
    """{name: a call with no arguments}: one decoding step (`model.step`, no draw) of a shipped model at `batch`
    images, in float32 (the one-call C++ step), and at int8 through the one-call step (the kernel's products),
    the Python module loop with the kernel's products, and the module loop with fbgemm's."""
    from imagegen.dtypes import INT8
    from imagegen.ops.int8 import forced_product
    states = {"float32": model.init_state(batch, torch.device("cpu"), torch.float32)}
    for name, kind, one_call in (("int8_one_call", "kernel", True), ("int8_loop_kernel", "kernel", False),
                                 ("int8_loop_fbgemm", "fbgemm", False)):
        with forced_product(kind):
            states[name] = model.init_state(batch, torch.device("cpu"), INT8, whole_model_kernel=one_call)
        assert (states[name].kernel is not None) == one_call, f"{name}: the one-call step did not build"
    token = torch.randint(0, 256, (batch,), generator=torch.Generator().manual_seed(0))

    def call(state):
        def step():
            state.t = 1                                  # a fixed position: the state's contents do not change the cost
            model.step(token, state)
        return step
    return {name: call(state) for name, state in states.items()}


def shipped_model(name):
    """(the module of a shipped model or checkpoint, in evaluation mode; its checkpoint dict)."""
    from imagegen.store import checkpoint, shipped
    path = shipped.resolve(name)
    ck = checkpoint.load(path)
    return checkpoint.model_from_checkpoint(ck, path).eval(), ck


def step_rows(names, batches, rounds):
    """One row per shipped model and batch: CPU milliseconds per decoding step of each of STEPS (interleaved
    rounds, the best kept), and the ratios float32 / one-call int8 and module loop (fbgemm) / one-call int8."""
    rows = []
    for name in names:
        model = shipped_model(name)[0]
        for batch in batches:
            calls = step_calls(model, batch)
            per_round = max(1, 256 // batch)
            with torch.inference_mode():
                ms = {k: v / 1e3 for k, v in time_interleaved(calls, rounds, per_round, time.thread_time).items()}
            rows.append({"model": name, "batch": batch, **{f"{k}_ms": ms[k] for k in STEPS},
                         "float32_over_one_call": ms["float32"] / ms["int8_one_call"],
                         "loop_fbgemm_over_one_call": ms["int8_loop_fbgemm"] / ms["int8_one_call"],
                         "loop_kernel_over_one_call": ms["int8_loop_kernel"] / ms["int8_one_call"]})
    return rows


def generate_rows(names, batch, rounds):
    """One row per shipped model: CPU seconds to sample `batch` whole images (one batch, no guidance, the
    sampler's own choice of step) at float32 and at int8, in turns, `rounds` times; images/sec of the best."""
    from imagegen.model.transformer import model_dims
    from imagegen.precision import decide_precision
    from imagegen.sampling.decode import generate
    rows = []
    for name in names:
        model, ck = shipped_model(name)
        labels = torch.arange(batch) % model.num_classes if model.num_classes else None
        dtypes = {p: decide_precision(p, torch.device("cpu"), dims=model_dims(model), batch=batch,
                                      record=ck.get("record")).value for p in ("float32", "int8")}
        calls = {p: (lambda p=p: generate(model, batch, labels=labels, guidance=1.0, batch_size=batch,
                                          dtype=dtypes[p])) for p in dtypes}
        s = {k: v / 1e6 for k, v in time_interleaved(calls, rounds, 1, time.thread_time).items()}
        rows.append({"model": name, "batch": batch, "float32_s": s["float32"], "int8_s": s["int8"],
                     "float32_images_s": batch / s["float32"], "int8_images_s": batch / s["int8"],
                     "int8_over_float32": s["float32"] / s["int8"]})
    return rows


GENERATE_COLUMNS = [("model", "model", None), ("batch", "batch", None), ("float32_s", "float32 s", "{:.2f}"),
                    ("int8_s", "int8 s", "{:.2f}"), ("float32_images_s", "float32 images/sec", "{:.2f}"),
                    ("int8_images_s", "int8 images/sec", "{:.2f}"), ("int8_over_float32", "int8 / float32", "{:.2f}x")]

STEP_COLUMNS = [("model", "model", None), ("batch", "batch", None)] + [
    (f"{k}_ms", f"{k.replace('_', ' ')} ms", "{:.3f}") for k in STEPS] + [
    ("float32_over_one_call", "float32 / int8 one-call", "{:.2f}x"),
    ("loop_fbgemm_over_one_call", "loop fbgemm / one-call", "{:.2f}x"),
    ("loop_kernel_over_one_call", "loop kernel / one-call", "{:.2f}x")]

COLUMNS = [("group", "set", None), ("product", "product", None), ("d_in", "d_in", None), ("d_out", "d_out", None),
           ("batch", "rows", None), ("float32_us", "float32 panels us", "{:.2f}"),
           ("int8_kernel_us", "int8 kernel us", "{:.2f}"), ("fbgemm_us", "fbgemm int8 us", "{:.2f}"),
           ("float32_over_int8", "float32 / int8 kernel", "{:.2f}x"),
           ("fbgemm_over_int8", "fbgemm / int8 kernel", "{:.2f}x")]


def main(argv=None):
    from imagegen.ops.build import ensure_kernel, load_kernel
    from imagegen.ops.int8 import forced_form, int8_form
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/int8_step.json", help="the JSON (the markdown beside it, .md)")
    p.add_argument("--rounds", type=int, default=30, help="timed rounds per product (the best is kept)")
    p.add_argument("--calls", type=int, default=40, help="calls per round")
    p.add_argument("--steps", nargs="+", metavar="MODEL", default=None,
                   help="time whole decoding steps of these shipped models instead (see step_calls)")
    p.add_argument("--step-batches", nargs="+", type=int, default=list(STEP_BATCHES), help="batches for --steps")
    p.add_argument("--generate", type=int, metavar="BATCH", default=None,
                   help="with --steps: time sampling BATCH whole images at float32 and int8 instead (generate_rows)")
    p.add_argument("--form", default="auto",
                   help="the kernel's int8 form: auto (the best this CPU runs), vnni, avx2 or portable")
    a = p.parse_args(argv)
    why = ensure_kernel("cpu")                         # the build stays out of the timings
    if why is not None:
        raise SystemExit(f"int8_step: the C++ kernel is unavailable here: {why}")
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    with forced_form(a.form):
        form = int8_form()
        if a.steps and a.generate:
            rows, columns = generate_rows(a.steps, a.generate, a.rounds), GENERATE_COLUMNS
            unit = "one batch of whole images, CPU seconds"
        elif a.steps:
            rows, columns = step_rows(a.steps, a.step_batches, a.rounds), STEP_COLUMNS
            unit = "calls (256 / batch steps each), CPU milliseconds per step"
        else:
            rows, columns, unit = measure(a.rounds, a.calls), COLUMNS, f"{a.calls} calls, microseconds per call"
    header = (f"{machine()}; int8 kernel: its {form} form (of {', '.join(load_kernel('cpu').decode_int8_forms())} "
              f"here; --form picks one); "
              f"1-min load {load_before:.2f} before ({os.cpu_count()} cores); best of {a.rounds} interleaved "
              f"rounds of {unit}")
    payload = {"machine": machine(), "form": form, "loadavg_1min": load_before, "cores": os.cpu_count(),
               "when": time.strftime("%Y-%m-%d %H:%M:%S"), "rounds": a.rounds, "calls": a.calls, "rows": rows}
    out = a.out[:-5] if a.out.endswith(".json") else a.out
    write_outputs(os.path.dirname(out) or ".", os.path.basename(out), payload,
                  header + "\n\n" + markdown_table(rows, columns))


if __name__ == "__main__":
    one_line(main)()
