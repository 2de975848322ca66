"""The small-batch products of decoding at 1, 2 and 4 rows: float32 in panels (the C++ kernel's
decode_linear), 8-bit weights through the C++ kernel's own int8 product (decode_linear_int8:
x quantized per row, int32 sums, AVX512-VNNI where the CPU has it), and through torch's fbgemm
dynamic quantized linear (`imagegen.ops.int8.linear_int8`, what precision=int8 runs today).

    python -m imagegen.benchmarks.int8_step --out bench/int8_step.json     # about a minute

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

from .report import machine, markdown_table, write_outputs
from ..errors import one_line

SHAPES = [("256->768", 256, 768), ("256->1024", 256, 1024), ("1024->256", 1024, 256)]
# paper_cifar (conf/preset/paper_cifar.yaml: d_model 256, d_ff 1024): one block's products
PAPER_CIFAR = [("qkv", 256, 768), ("out", 256, 256), ("ff1", 256, 1024), ("ff2", 1024, 256)]
BATCHES = (1, 2, 4)
PRODUCTS = ("float32", "int8_kernel", "fbgemm")


def products(d_in, d_out, batch, seed=0):
    """{name: a call with no arguments} for the three products of one shape and batch."""
    from ..ops.build import load_kernel
    from ..ops.int8 import linear_int8, pack_int8, quantize
    from ..ops.layout import panels
    kernel = load_kernel("cpu")
    g = torch.Generator().manual_seed(seed)
    w, b = torch.randn(d_in, d_out, generator=g) * 0.05, torch.randn(d_out, generator=g) * 0.1
    x = torch.randn(batch, d_in, generator=g)
    laid_out, packed, fbgemm = panels(w), pack_int8(w), quantize(w, b)
    return {"float32": lambda: kernel.decode_linear(x, laid_out, b),
            "int8_kernel": lambda: kernel.decode_linear_int8(x, *packed, b),
            "fbgemm": lambda: linear_int8(x, fbgemm)}


def time_interleaved(calls, rounds, per_round):
    """{name: best microseconds per call} of each call, timed in turns, round by round."""
    best = {name: float("inf") for name in calls}
    for fn in calls.values():                            # warm up
        for _ in range(per_round):
            fn()
    for _ in range(rounds):
        for name, fn in calls.items():
            start = time.perf_counter()
            for _ in range(per_round):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / per_round * 1e6)
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


COLUMNS = [("group", "set", None), ("product", "product", None), ("d_in", "d_in", None), ("d_out", "d_out", None),
           ("batch", "rows", None), ("float32_us", "float32 panels us", "{:.2f}"),
           ("int8_kernel_us", "int8 kernel us", "{:.2f}"), ("fbgemm_us", "fbgemm int8 us", "{:.2f}"),
           ("float32_over_int8", "float32 / int8 kernel", "{:.2f}x"),
           ("fbgemm_over_int8", "fbgemm / int8 kernel", "{:.2f}x")]


def main(argv=None):
    from ..ops.build import ensure_kernel, load_kernel
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/int8_step.json", help="the JSON (the markdown beside it, .md)")
    p.add_argument("--rounds", type=int, default=30, help="timed rounds per product (the best is kept)")
    p.add_argument("--calls", type=int, default=40, help="calls per round")
    a = p.parse_args(argv)
    why = ensure_kernel("cpu")                         # the build stays out of the timings
    if why is not None:
        raise SystemExit(f"int8_step: the C++ kernel is unavailable here: {why}")
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    rows = measure(a.rounds, a.calls)
    vnni = bool(load_kernel("cpu").decode_int8_vnni())
    header = (f"{machine()}; int8 kernel: {'AVX512-VNNI' if vnni else 'portable loop (no AVX512-VNNI)'}; "
              f"1-min load {load_before:.2f} before ({os.cpu_count()} cores); best of {a.rounds} interleaved "
              f"rounds of {a.calls} calls, microseconds per call")
    payload = {"machine": machine(), "vnni": vnni, "loadavg_1min": load_before, "cores": os.cpu_count(),
               "when": time.strftime("%Y-%m-%d %H:%M:%S"), "rounds": a.rounds, "calls": a.calls, "rows": rows}
    out = a.out[:-5] if a.out.endswith(".json") else a.out
    write_outputs(os.path.dirname(out) or ".", os.path.basename(out), payload,
                  header + "\n\n" + markdown_table(rows, COLUMNS))


if __name__ == "__main__":
    one_line(main)()
