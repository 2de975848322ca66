"""Reformer-style causal LSH attention (Kitaev et al. 2020), made strictly causal.

Shared query/key projection; keys are the L2-normalised queries. Each of n_hashes
rounds draws a random rotation R (E x B/2) per head and hashes a position to
argmax([xR, -xR]) among B buckets. Positions are sorted by (bucket, position) and cut
into chunks of C; a query attends within its chunk and the previous one, restricted to
keys in its own bucket, at earlier positions, and at most C places back in sorted
order. Within a bucket the sorted order is the time order, so a query sees exactly
the C most recent earlier positions of its bucket: a set that depends on the past only
(plain chunking would let future positions shift chunk boundaries). A query attends to
itself only when nothing else is available. Rounds are combined by their
log-sum-exp weights. The sequence is padded to a multiple of C here.

Hashing draws fresh rotations in training and a fixed seed (`eval_seed`) in eval mode,
so evaluation is reproducible. LSH has no incremental state: it cannot `step`.
"""
import torch
import torch.nn.functional as F

from ..config import LSHOptions
from ..errors import UserError
from ..ops.dense import Dense
from .base import Attention
from .registry import register

MASKED = -1e9      # score of a key a query may not see
SELF = -1e5        # score of the query's own position: used only when nothing else is visible


@register("lsh")
class LSHAttention(Attention):
    """Args: d_model, n_heads, and the options of `LSHOptions` (imagegen/config/schema.py) as keywords:
    n_hashes=1 (rounds), n_buckets=64 (even), chunk_size=32, eval_seed=0."""
    can_step = False
    Options = LSHOptions

    def __init__(self, d_model, n_heads, **options):
        super().__init__(d_model, n_heads)
        o = self.parse_options(options)
        n_hashes, n_buckets, chunk_size, eval_seed = o.n_hashes, o.n_buckets, o.chunk_size, o.eval_seed
        if n_buckets % 2 or n_buckets < 2:
            raise UserError(f"LSH n_buckets must be even and >= 2 (got {n_buckets}).")
        if n_hashes < 1 or chunk_size < 1:
            raise UserError(f"LSH needs n_hashes >= 1 and chunk_size >= 1 (got {n_hashes}, {chunk_size}).")
        self.qk = Dense(d_model, d_model)
        self.v = Dense(d_model, d_model)
        self.n_hashes, self.n_buckets, self.chunk_size, self.eval_seed = n_hashes, n_buckets, chunk_size, eval_seed

    def rotations(self, device, dtype):
        """(H, E, R, B/2) random normal; seeded in eval mode."""
        g = None
        if not self.training:
            g = torch.Generator(device=device).manual_seed(self.eval_seed)
        shape = (self.n_heads, self.head_dim, self.n_hashes, self.n_buckets // 2)
        return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)

    def forward(self, x):                                    # x (N, L, D)
        qk, v = self.split(self.qk(x)), self.split(self.v(x))     # (N, H, L, E)
        N, H, L, E = qk.shape
        R, C = self.n_hashes, min(self.chunk_size, L)

        proj = torch.einsum("nhle,herb->nhrlb", qk.detach(), self.rotations(x.device, qk.dtype))
        buckets = torch.cat([proj, -proj], dim=-1).argmax(dim=-1)            # (N, H, R, L)
        pos = torch.arange(L, device=x.device)
        order = (buckets * L + pos).argsort(dim=-1)                          # sort by (bucket, position)

        pad = (-L) % C
        n = (L + pad) // C
        # sorted positions, buckets; padding gets position L (after everything) and bucket -1
        spos = F.pad(order, (0, pad), value=L)                               # (N, H, R, Lp)
        sbkt = F.pad(buckets.gather(-1, order), (0, pad), value=-1)
        take = lambda t: F.pad(t, (0, 0, 0, pad)).unsqueeze(2).expand(N, H, R, L + pad, E)
        idx = spos.clamp(max=L - 1).unsqueeze(-1).expand(N, H, R, L + pad, E)
        sq = take(qk).gather(3, idx)                                         # (N, H, R, Lp, E)
        sv = take(v).gather(3, idx)
        sk = F.normalize(sq, dim=-1)

        def chunks(t):          # (N, H, R, Lp, ...) -> (N, H, R, n, C, ...)
            return t.reshape(N, H, R, n, C, *t.shape[4:])

        def with_prev(t):       # keys of a chunk: the previous chunk, then its own -> (N, H, R, n, 2C, ...)
            prev = torch.cat([t[:, :, :, -1:], t[:, :, :, :-1]], dim=3)
            return torch.cat([prev, t], dim=4)

        qc, kc, vc = chunks(sq), with_prev(chunks(sk)), with_prev(chunks(sv))
        qpos, kpos = chunks(spos), with_prev(chunks(spos))
        qb, kb = chunks(sbkt), with_prev(chunks(sbkt))
        # sorted index of each query and key; the previous chunk of chunk 0 wraps around to the last
        # chunk, whose keys are invisible anyway (same bucket there means a later position)
        qs = torch.arange(L + pad, device=x.device).view(n, C)
        ks = torch.cat([qs.roll(1, dims=0), qs], dim=1)                      # (n, 2C)

        scores = torch.einsum("nhrice,nhride->nhricd", qc, kc) * E ** -0.5  # (N, H, R, n, C, 2C)
        visible = ((qb[..., :, None] == kb[..., None, :])
                   & (kpos[..., None, :] < qpos[..., :, None])
                   & (ks[:, None, :] >= qs[:, :, None] - C))
        is_self = kpos[..., None, :] == qpos[..., :, None]
        scores = torch.where(visible, scores, torch.where(is_self, torch.full_like(scores, SELF),
                                                          torch.full_like(scores, MASKED)))
        lse = scores.logsumexp(dim=-1)                                       # (N, H, R, n, C)
        out = torch.einsum("nhricd,nhridm->nhricm", torch.softmax(scores, dim=-1), vc)

        # unsort: position order[j] received sorted slot j
        out = out.reshape(N, H, R, L + pad, E)[:, :, :, :L]
        lse = lse.reshape(N, H, R, L + pad)[:, :, :, :L]
        inv = order.argsort(dim=-1)
        out = out.gather(3, inv.unsqueeze(-1).expand(N, H, R, L, E))
        lse = lse.gather(3, inv)
        weights = torch.softmax(lse, dim=2).unsqueeze(-1)                    # combine rounds
        return self.merge((out * weights).sum(dim=2))
