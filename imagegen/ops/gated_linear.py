"""Causal linear attention with a scalar decay per head and position (random feature attention's
gate, in the form gated linear attention implementations use), in pure PyTorch.

On feature-mapped q, k (N, H, L, F), values v (N, H, L, M) and log-decays log_g (N, H, L) <= 0:
    S_t = g_t S_{t-1} + k_t v_t^T,   z_t = g_t z_{t-1} + k_t,
    out_t = q_t S_t / (q_t . z_t + eps).
(Random feature attention's gate S_t = g_t S_{t-1} + (1 - g_t) phi(k_t) v_t^T is this with
k_t = (1 - g_t) phi(k_t); the caller scales the keys.) log_g = 0 is the ungated attention.
z rides along as a ones column of v. Forms:
  `gated_reference`  quadratic: (q k^T * exp(c_i - c_j) * tril) [v, 1] with c = cumsum(log_g); for tests
  `gated_chunked`    masked products inside chunks of C positions with the decay exp(b_i - b_j) from
                     the cumulative log-decays b within the chunk, and the state carried between
                     chunks (decayed by the chunk's total): one Python iteration per chunk, not per position
  `gated_step`       one position of the recurrence, S (N H, F, M + 1) updated in place (sampling)
Shape letters: N batch, H heads, L length, F features, M value dim, C chunk.
"""
import torch
import torch.nn.functional as F

from .causal_linear import normalise, with_ones


def gated_reference(q, k, v, log_g, eps):
    """Quadratic reference, O(L^2) memory."""
    L = q.shape[2]
    c = log_g.cumsum(-1)                                                        # (N, H, L)
    mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    decay = (c[..., :, None] - c[..., None, :]).masked_fill(~mask, float("-inf")).exp()   # (N, H, L, L)
    scores = torch.einsum("nhlf,nhsf->nhls", q, k) * decay
    return normalise(scores @ with_ones(v), eps)


def gated_chunked(q, k, v, log_g, eps, chunk_size=64):
    """Chunked form (see the module docstring); any length (the tail chunk is padded with zero
    keys and log_g = 0). Memory O(L (F + M) + L C + F M)."""
    N, H, L, Fd = q.shape
    C = max(1, min(chunk_size, L))
    pad = (-L) % C
    v1 = with_ones(v)
    if pad:
        q, k, v1 = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v1))
        log_g = F.pad(log_g, (0, pad))
    n = (L + pad) // C
    qc, kc, vc = (t.reshape(N, H, n, C, t.shape[-1]) for t in (q, k, v1))
    b = log_g.reshape(N, H, n, C).cumsum(-1)                                    # (N, H, n, C) within each chunk
    mask = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = (b[..., :, None] - b[..., None, :]).masked_fill(~mask, float("-inf")).exp()   # (N, H, n, C, C)
    intra = ((qc @ kc.transpose(-1, -2)) * decay) @ vc                          # (N, H, n, C, M + 1)
    q_in = qc * b.exp()[..., None]                                              # q_i decayed from the chunk start
    k_out = kc * (b[..., -1:] - b).exp()[..., None]                             # k_j decayed to the chunk end
    kv = k_out.transpose(-1, -2) @ vc                                           # (N, H, n, F, M + 1)
    total = b[..., -1].exp()                                                    # (N, H, n) decay over a chunk
    S = q.new_zeros(N, H, Fd, v1.shape[-1])
    inter = []
    for i in range(n):                                                          # one iteration per chunk
        inter.append(q_in[:, :, i] @ S)
        S = S * total[:, :, i, None, None] + kv[:, :, i]
    out = intra + torch.stack(inter, 2)
    return normalise(out.reshape(N, H, n * C, -1)[:, :, :L], eps)


def gated_step(q, k, v, g, S, eps):
    """One position: q, k (N, H, F), v (N, H, M), g (N, H) in (0, 1] or None (no decay); S (N H, F,
    M + 1) holds S and z as its last column, updated in place: S = g S + k [v, 1]^T. Returns out (N, H, M)."""
    N, H, Fd = q.shape
    if g is not None:
        S.mul_(g.reshape(N * H, 1, 1))
    S.baddbmm_(k.reshape(N * H, Fd, 1), with_ones(v).reshape(N * H, 1, -1))
    return normalise(torch.bmm(q.reshape(N * H, 1, Fd), S).view(N, H, -1), eps)
