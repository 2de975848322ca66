"""The public ops of causal linear attention, each running the implementation `dispatch.resolve_impl`
names: `causal_product` (the numerator), `causal_linear_attention` (normalised, on feature-mapped q,
k), `linear_attention` (the model's: phi(x) = elu(x) + 1 applied here), `mapped_linear_attention`
(another feature map, applied by the caller), `gated_linear_attention` (a decay per position) and
`linear_attention_qkv` (heads split and merged). Shape letters: N batch, H heads, L length, E
query/key dim, M value dim.
"""
import torch

from .build import warn_fallback
from .causal_linear import (EPS, causal_product_chunked, causal_product_cumsum, causal_product_reference, check_qkv,
                            normalise, phi, with_ones)
from .dispatch import IMPLS, default_chunk_size, resolve_impl
from .gated_linear import gated_chunked, gated_reference
from .kernel import causal_product_kernel, linear_attention_kernel
from .triton_linear import linear_attention_triton


def causal_product(q, k, v, impl="auto", chunk_size=None):
    """V'_i = sum_{j<=i} (q_i . k_j) v_j for q, k (N, H, L, E) and v (N, H, L, M) -> (N, H, L, M).

    chunk_size only affects impl="chunked" (any length works, the tail chunk is padded);
    None picks `default_chunk_size(q)`.
    """
    impl = resolve_impl(q, k, v, impl, chunk_size)
    if impl == "kernel":
        return causal_product_kernel(q, k, v)
    if impl == "chunked":
        return causal_product_chunked(q, k, v, chunk_size or default_chunk_size(q))
    if impl == "cumsum":
        return causal_product_cumsum(q, k, v)
    return causal_product_reference(q, k, v)


def causal_linear_attention(q, k, v, impl="auto", eps=EPS, chunk_size=None):
    """Normalised causal linear attention on feature-mapped q, k (N, H, L, E), v (N, H, L, M):
    out_i = sum_{j<=i} (q_i . k_j) v_j / (sum_{j<=i} q_i . k_j + eps) -> (N, H, L, M).

    The denominator comes from the same pass: a ones column appended to v (M + 1 columns).
    """
    return normalise(causal_product(q, k, with_ones(v), impl=impl, chunk_size=chunk_size), eps)


def compute_dtype(x):
    """The dtype the PyTorch forms of `linear_attention` compute in for inputs like x: float32
    for float16 and bfloat16 on the CPU (running sums need float32), else x's."""
    return torch.float32 if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def linear_attention(q, k, v, impl="auto", eps=EPS, chunk_size=None):
    """The model's causal linear attention on raw q, k (N, H, L, E) and v (N, H, L, M):
    causal_linear_attention(phi(q), phi(k), v) -> (N, H, L, M). On the CPU, impl "kernel"
    (which "auto" picks there) runs one fused kernel that never materialises phi(q), phi(k) or
    the ones column; q, k, v may be strided views (of one projection, say).

    Never autocast: its running sums need float32. float16/bfloat16 inputs (from an autocast
    projection, say) go to the kernels as they are (they sum in float32); the CPU's chunked form
    computes them in float32 and casts the result back."""
    with torch.autocast(q.device.type, enabled=False):
        impl = resolve_impl(q, k, v, impl, chunk_size, fused=True)
        if impl == "kernel" and q.device.type == "cpu":
            return linear_attention_kernel(q, k, v, eps=eps)
        if impl == "triton":
            return linear_attention_triton(q, k, v, eps=eps)
        dtype = compute_dtype(q)
        if dtype != q.dtype:
            return linear_attention(q.to(dtype), k.to(dtype), v.to(dtype), impl, eps, chunk_size).to(q.dtype)
        return causal_linear_attention(phi(q), phi(k), v, impl=impl, eps=eps, chunk_size=chunk_size)


def mapped_linear_attention(q, k, v, impl="auto", eps=EPS, chunk_size=None):
    """The model's causal linear attention on features q, k (N, H, L, F) of any feature map
    (applied by the caller, whose autograd then carries the gradient through it) and v (N, H, L, M)
    -> (N, H, L, M). impl "kernel" (which "auto" picks on the CPU, by the rule of `decide_impl`)
    runs the fused CPU kernel with phi the identity (any F, M; float32, float64, bfloat16 as they
    come); on CUDA the compiled numerator on [v, 1] and a division. "triton" (which "auto" picks on
    CUDA where it works) runs the Triton kernels with phi the identity (F, M <= 128); other impls as
    in `causal_linear_attention`."""
    with torch.autocast(q.device.type, enabled=False):
        impl = resolve_impl(q, k, v, impl, chunk_size, fused=True)
        if impl == "kernel" and q.device.type == "cpu":
            return linear_attention_kernel(q, k, v, eps=eps, mapped=True)
        if impl == "triton":
            return linear_attention_triton(q, k, v, eps=eps, mapped=True)
        dtype = compute_dtype(q)
        if dtype != q.dtype:
            return mapped_linear_attention(q.to(dtype), k.to(dtype), v.to(dtype), impl, eps, chunk_size).to(q.dtype)
        return causal_linear_attention(q, k, v, impl=impl, eps=eps, chunk_size=chunk_size)


def gated_linear_attention(q, k, v, log_g, impl="auto", eps=EPS, chunk_size=None):
    """Causal linear attention with a decay per head and position: features q, k (N, H, L, F),
    v (N, H, L, M), log_g (N, H, L) <= 0 -> (N, H, L, M); see gated_linear.py for the recurrence.
    impl "reference" runs the quadratic form; every other the chunked PyTorch form, the only fast
    one: "kernel" and "triton" fall back to it with one warning (neither has the decay)."""
    if impl not in IMPLS:
        raise ValueError(f"unknown gated attention impl {impl!r}; choose one of {', '.join(IMPLS)}.")
    check_qkv(q, k, v)
    if log_g.shape != q.shape[:3]:
        raise ValueError(f"log_g must be (N, H, L) = {tuple(q.shape[:3])}, got {tuple(log_g.shape)}.")
    if impl in ("kernel", "triton"):
        warn_fallback(f"the {impl} form of the gated attention", q.device.type, "the decay is not in those kernels")
    with torch.autocast(q.device.type, enabled=False):
        dtype, out_dtype = compute_dtype(q), q.dtype
        q, k, v, log_g = (t.to(dtype) for t in (q, k, v, log_g))
        if impl == "reference":
            return gated_reference(q, k, v, log_g, eps).to(out_dtype)
        return gated_chunked(q, k, v, log_g, eps, chunk_size or default_chunk_size(q)).to(out_dtype)


def linear_attention_qkv(qkv, n_heads, impl="auto", eps=EPS):
    """`linear_attention` with heads split and merged: qkv (N, L, 3 H E), the queries, keys and
    values of H heads side by side as one projection makes them -> (N, L, H E). The fused CPU
    kernel and the Triton kernels take qkv whole, so that its gradient comes back as one tensor, not three to
    concatenate."""
    N, L, _ = qkv.shape
    heads = qkv.view(N, L, 3, n_heads, -1)
    q, k, v = heads.permute(2, 0, 3, 1, 4)                                  # (N, H, L, E) views
    impl = resolve_impl(q, k, v, impl, None, fused=True)
    with torch.autocast(qkv.device.type, enabled=False):
        if qkv.device.type == "cpu" and impl == "kernel":
            out = linear_attention_kernel(heads, eps=eps)
        elif impl == "triton":
            out = linear_attention_triton(heads, eps=eps)
        else:
            out = linear_attention(q, k, v, impl, eps)                  # impl resolved: not chosen again
    return out.transpose(1, 2).reshape(N, L, -1)
