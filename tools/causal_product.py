"""Time the causal product implementations against each other (same process, same
threads, same inputs, interleaved rounds): forward (no grad) and forward+backward, in
milliseconds, median over rounds.

    python -m tools.causal_product [--device cpu] [--dtype float32] [--json out.json]
        [--shapes 4,8,784,32,32 16,4,3072,32,32 ...] [--chunks 32,64,128] [--repeat 5] [--quick]

Shapes are N,H,L,E,M. Prints the plan, then one table per shape as it is measured, with the
backward's time over the forward's (bwd/fwd = (fwd+bwd - fwd) / fwd); --json is rewritten after
every shape ("partial": true until the last), so a stopped run keeps what it measured.
--quick: two shapes, one chunk size, 3 repeats (about a minute on 2 cores).
On the CPU memory is set up as every command sets it (`imagegen.ops.allocator.for_device`):
otherwise every output of 32 MB or more is mapped afresh and faulted in at every call, which
made the backward grow faster than the length past ~8k positions (at N=4, H=8, E=M=32).
"""
import argparse
import json
import os
import time

import torch

from imagegen.ops.allocator import for_device
from imagegen.ops import causal_product, kernel_error
from imagegen.benchmarks.report import machine
from imagegen.benchmarks.timing import backward_over_forward, time_all
from imagegen.errors import one_line

DEFAULT_SHAPES = ["4,8,784,32,32", "4,8,3072,32,32", "4,8,16384,32,32",
                  "16,4,784,32,32", "16,4,3072,32,32"]


def bench_shape(shape, device, dtype, chunks, repeat):
    """Rows {shape, impl, chunk, fwd_ms, fwd_bwd_ms} for one (N, H, L, E, M)."""
    N, H, L, E, M = shape
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k = (torch.rand(N, H, L, E, generator=gen).to(device, dtype) for _ in range(2))
    v = torch.randn(N, H, L, M, generator=gen).to(device, dtype)
    grad = torch.randn(N, H, L, M, generator=gen).to(device, dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    candidates = {f"chunked/{c}": {"impl": "chunked", "chunk_size": c} for c in chunks}
    if kernel_error(device.type) is None:
        candidates["kernel"] = {"impl": "kernel"}

    def fwd(kw):
        with torch.no_grad():
            causal_product(q, k, v, **kw)

    def fwd_bwd(kw):
        torch.autograd.grad(causal_product(*leaves, **kw), leaves, grad)

    f = time_all({n: (lambda kw=kw: fwd(kw)) for n, kw in candidates.items()}, device, repeat)
    fb = time_all({n: (lambda kw=kw: fwd_bwd(kw)) for n, kw in candidates.items()}, device, repeat)
    return [{"shape": list(shape), "impl": n, "fwd_ms": f[n], "fwd_bwd_ms": fb[n]} for n in candidates]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--shapes", nargs="*", default=DEFAULT_SHAPES)
    p.add_argument("--chunks", default="32,64,128")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads before timing")
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true", help="shapes 4,8,784 and 4,8,3072 (E=M=32), chunk 64, repeat 3")
    args = p.parse_args(argv)
    if args.quick:
        args.shapes, args.chunks, args.repeat = ["4,8,784,32,32", "4,8,3072,32,32"], "64", 3
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    for_device(device)                    # memory as every command sets it (CPU)
    chunks = [int(c) for c in args.chunks.split(",") if c]
    print(f"device={device} dtype={args.dtype} threads={torch.get_num_threads()} repeat={args.repeat}")
    print(f"plan: {len(args.shapes)} shapes ({' '.join(args.shapes)}) x impls chunked/{args.chunks} and kernel, "
          f"fwd and fwd+bwd, {args.repeat} rounds each; CPU: {machine()}", flush=True)
    all_rows, start = [], time.perf_counter()
    for i, s in enumerate(args.shapes):
        shape = tuple(int(x) for x in s.split(","))
        rows = bench_shape(shape, device, dtype, chunks, args.repeat)
        all_rows += rows
        elapsed = time.perf_counter() - start
        print(f"\nN,H,L,E,M = {shape}   [{i + 1}/{len(args.shapes)}, {elapsed:.0f} s, about "
              f"{elapsed / (i + 1) * (len(args.shapes) - i - 1):.0f} s left]")
        print(f"{'impl':<14}{'fwd ms':>10}{'fwd+bwd ms':>12}{'bwd/fwd':>9}")
        for r in rows:
            r["bwd_over_fwd"] = ratio = backward_over_forward(r["fwd_ms"], r["fwd_bwd_ms"])
            print(f"{r['impl']:<14}{r['fwd_ms']:>10.2f}{r['fwd_bwd_ms']:>12.2f}"
                  f"{'-' if ratio is None else f'{ratio:.2f}':>9}", flush=True)
        if args.json:
            tmp = f"{args.json}.tmp"
            with open(tmp, "w") as f:
                json.dump({"partial": i + 1 < len(args.shapes), "device": str(device), "dtype": args.dtype,
                           "threads": torch.get_num_threads(), "machine": machine(), "rows": all_rows}, f, indent=1)
            os.replace(tmp, args.json)


if __name__ == "__main__":
    one_line(main)()
