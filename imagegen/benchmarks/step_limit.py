"""How far a linear model's decoding step is from what this machine allows (the sampling table's
"share of limit" column).

limit (s) = the step's matrix-product FLOPs at the machine's measured GFLOP/s
          + the bytes the step must move (the weights once, the S, z state read and written)
            at the machine's measured memory bandwidth.
share = limit / measured step time: 1.0 would be a step that only multiplies at full speed and
moves what it must. Both rates are measured once per process, in the thread count in use: the
products as one (256, D) x (D, 4D) product in the products' dtype (the faster of torch's addmm and
oneDNN's prepacked product, which decoding may use: `ops.layout.pack`; int8: fbgemm's, `ops.int8.quantize`,
its weights counted at 1 byte each), the bandwidth as a copy of
256 MiB. Shape letters: N batch, D model dim, F feed-forward dim, P head parameters, H heads, E head dim.
"""
import functools
import time

import torch

from ..dtypes import INT8
from ..ops.dense import Dense, dense
from ..ops.int8 import quantize
from ..ops.layout import can_pack, prepacked


def best_seconds(fn, reps=5):
    fn()
    times = []
    for _ in range(reps):
        begin = time.perf_counter()
        fn()
        times.append(time.perf_counter() - begin)
    return min(times)


@functools.lru_cache(maxsize=None)
def machine_rates(d_model, dtype=torch.float32, threads=None):
    """(FLOP/s of a (256, D) x (D, 4D) product in dtype, bytes/s of a 256 MiB copy) on this CPU;
    threads: part of the cache key (the rates depend on torch's thread count)."""
    if dtype == INT8:                 # fbgemm's int8 product, as decoding runs it (`ops.dense.dense`)
        a, w = torch.randn(256, d_model), quantize(torch.randn(d_model, 4 * d_model), torch.zeros(4 * d_model))
        seconds = best_seconds(lambda: dense(a, (w, None)))
    else:
        a, b = torch.randn(256, d_model, dtype=dtype), torch.randn(d_model, 4 * d_model, dtype=dtype)
        seconds = best_seconds(lambda: a @ b)
    if dtype != INT8 and can_pack(dtype):
        packed, bias = prepacked(b, 256), torch.zeros(4 * d_model, dtype=dtype)
        seconds = min(seconds, best_seconds(lambda: dense(a, (packed, bias))))
    flops = 2 * 256 * d_model * 4 * d_model / seconds
    src = torch.empty(2 ** 26, dtype=torch.float32)                      # 256 MiB
    dst = torch.empty_like(src)
    bandwidth = 2 * src.nbytes / best_seconds(lambda: dst.copy_(src), reps=3)    # read + write
    return flops, bandwidth


def step_cost(model, batch, dtype=torch.float32):
    """(FLOPs, bytes) of one decoding step of a linear-attention PixelTransformer for `batch` images:
    2 N x (weights of every product), plus per layer the state update and read (4 N H E (E + 1));
    bytes: the products' weights once in dtype, and the float32 state S, z read and written."""
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, Dense))
    attn = [b.attn for b in model.blocks]
    state = sum(a.n_heads * a.head_dim * (a.head_dim + 1) for a in attn) * batch
    flops = 2 * batch * weights + 4 * state
    moved = weights * dtype.itemsize + 2 * state * 4
    return flops, moved


def limit_share(model, batch, step_seconds, dtype=torch.float32):
    """limit / step_seconds for this model at this batch (see the module's docstring)."""
    flops, moved = step_cost(model, batch, dtype)
    rate, bandwidth = machine_rates(model.blocks[0].attn.d_model, dtype, torch.get_num_threads())
    return (flops / rate + moved / bandwidth) / step_seconds
