"""Causal linear attention in pure PyTorch: a quadratic reference, a cumsum form and a
chunked form. Shape letters: N batch, H heads, L length, E query/key dim, M value dim.

The causal_product_* functions take feature-mapped queries and keys (phi already applied,
non-negative) and compute the causal numerator  V'_i = sum_{j<=i} (q_i . k_j) v_j;
`linear_attention_reference` is the whole normalised attention on raw q, k, written as plainly as
possible: what every fast form (chunked, the C++ kernels, Triton) is tested against in float64.
"""
import torch
import torch.nn.functional as F

EPS = 1e-6  # added to the denominator phi(q_i) . sum_{j<=i} phi(k_j), which is > 0 for elu+1


def phi(x):
    """The feature map of the paper: elu(x) + 1 > 0."""
    return F.elu(x) + 1


def with_ones(v):
    """v (..., M) -> [v, 1] (..., M + 1): the denominator's column, summed in the same pass as the numerator."""
    return F.pad(v, (0, 1), value=1.0)


def normalise(out, eps):
    """[num, den] (..., M + 1) -> num / (den + eps) (..., M)."""
    return out[..., :-1] / (out[..., -1:] + eps)


def check_qkv(q, k, v):
    """Raise ValueError with an actionable sentence when q, k, v do not fit together."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"causal linear attention expects 4-d tensors (N, H, L, E/M); got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}: reshape to (batch, heads, length, dim).")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape (N, H, L, E); got {tuple(q.shape)} and {tuple(k.shape)}.")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must share (N, H, L) with q; got v {tuple(v.shape)} and q {tuple(q.shape)}.")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}: cast them first.")


def causal_product_reference(q, k, v):
    """Quadratic masked reference: (q k^T * tril) v. O(L^2) memory; for tests."""
    L = q.shape[2]
    scores = torch.einsum("nhle,nhse->nhls", q, k)
    mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    return torch.einsum("nhls,nhsm->nhlm", scores.masked_fill(~mask, 0), v)


def mapped_attention_reference(q, k, v, eps=EPS):
    """q_i . sum_{j<=i} k_j v_j^T / (q_i . sum_{j<=i} k_j + eps) by the quadratic product: features q, k
    (N, H, L, F) of any map, v (N, H, L, M) -> (N, H, L, M)."""
    num = causal_product_reference(q, k, v)
    den = causal_product_reference(q, k, torch.ones_like(v[..., :1]))
    return num / (den + eps)


def linear_attention_reference(q, k, v, eps=EPS):
    """`mapped_attention_reference` with phi = elu + 1 applied to raw q, k (N, H, L, E)."""
    return mapped_attention_reference(F.elu(q) + 1, F.elu(k) + 1, v, eps)


def causal_product_cumsum(q, k, v):
    """Cumulative sum of the outer products k_j v_j^T: O(L E M) memory, the naive linear form."""
    S = torch.einsum("nhle,nhlm->nhlem", k, v).cumsum(dim=2)   # (N, H, L, E, M)
    return torch.einsum("nhle,nhlem->nhlm", q, S)


def causal_product_chunked(q, k, v, chunk_size=64):
    """Chunked form: masked products inside each chunk of C positions plus the state
    S = sum k v^T carried between chunks. Any length works (the tail chunk is padded).
    Memory O(L (E + M) + (L / C) E M)."""
    N, H, L, E = q.shape
    M = v.shape[-1]
    C = max(1, min(chunk_size, L))
    pad = (-L) % C
    if pad:
        q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    n = (L + pad) // C
    qc, kc, vc = (t.reshape(N, H, n, C, t.shape[-1]) for t in (q, k, v))
    mask = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    intra = (qc @ kc.transpose(-1, -2)).masked_fill(~mask, 0) @ vc      # (N, H, n, C, M)
    kv = kc.transpose(-1, -2) @ vc                                       # (N, H, n, E, M)
    S = kv.cumsum(dim=2) - kv                                            # state before each chunk
    out = intra + qc @ S
    return out.reshape(N, H, n * C, M)[:, :, :L]
