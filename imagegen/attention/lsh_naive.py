"""The naive form of LSHAttention's forward (lsh.py), beside the fast path as its reference: a loop over
queries, slow but plainly the definition, which the tests hold the sorted, chunked
forward to. Same hashing (the attention's own rotations), same rule: each query attends to the
chunk_size most recent earlier positions of its bucket (itself only when there are none), rounds
combined by their log-sum-exp weights."""
import torch
import torch.nn.functional as F

from .lsh import SELF


def lsh_reference(attn, x):
    """What `attn(x)` computes, LSHAttention `attn` on x (N, L, D), by a loop over queries."""
    qk, v = attn.split(attn.qk(x)), attn.split(attn.v(x))          # (N, H, L, E)
    N, H, L, E = qk.shape
    rot = attn.rotations(x.device, x.dtype)                        # (H, E, R, B/2)
    out = torch.zeros_like(v)
    for n in range(N):
        for h in range(H):
            outs, lses = [], []
            for r in range(attn.n_hashes):
                proj = qk[n, h] @ rot[h, :, r]
                bucket = torch.cat([proj, -proj], -1).argmax(-1)
                o, lse = torch.zeros(L, E, dtype=x.dtype), torch.zeros(L, dtype=x.dtype)
                for i in range(L):
                    keys = [j for j in range(i) if bucket[j] == bucket[i]][-attn.chunk_size:] or [i]
                    k = F.normalize(qk[n, h, keys], dim=-1)
                    s = k @ qk[n, h, i] * E ** -0.5
                    if keys == [i]:
                        s = s * 0 + SELF
                    o[i], lse[i] = torch.softmax(s, 0) @ v[n, h, keys], s.logsumexp(0)
                outs.append(o)
                lses.append(lse)
            w = torch.softmax(torch.stack(lses), 0).unsqueeze(-1)
            out[n, h] = (torch.stack(outs) * w).sum(0)
    return attn.merge(out)
