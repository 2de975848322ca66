"""Softmax attention: torch's scaled_dot_product_attention, causal; steps with a preallocated KV cache.

Under bfloat16 decoding the projections run in bfloat16 and the cache stays float32 unless
`bf16_cache` is set: torch's CPU attention over a bfloat16 cache measured slower than over a float32
one (docs/notes/code-measurements.md)."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config import SoftmaxOptions
from ..dtypes import activation_dtype
from ..ops.dense import Dense, dense
from .base import Attention, AttentionState
from .registry import register


@dataclass
class KVCache(AttentionState):
    """Keys and values (N, H, max_len, E) of the positions so far, written in place; t: the next position."""
    k: torch.Tensor
    v: torch.Tensor
    t: int = 0


@register("softmax")
class SoftmaxAttention(Attention):
    """Exact causal softmax attention. Args: d_model, n_heads; no options (`SoftmaxOptions`)."""
    Options = SoftmaxOptions

    bf16_cache = False   # keep the KV cache in bfloat16 under bfloat16 decoding (halves it; slower here)

    def __init__(self, d_model, n_heads, **options):
        super().__init__(d_model, n_heads)
        self.parse_options(options)
        self.qkv = Dense(d_model, 3 * d_model)

    def forward(self, x):                                    # x (N, L, D)
        q, k, v = (self.split(t) for t in self.qkv(x).chunk(3, dim=-1))   # (N, H, L, E)
        return self.merge(F.scaled_dot_product_attention(q, k, v, is_causal=True))

    def init_state(self, batch, max_len, device, dtype):
        """A K/V cache of max_len positions, allocated once and written in place: in dtype, except
        float32 for bfloat16 products unless bf16_cache, and for int8 products (dtypes.INT8)."""
        shape = (batch, self.n_heads, max_len, self.head_dim)
        cache = torch.float32 if dtype == torch.bfloat16 and not self.bf16_cache else activation_dtype(dtype)
        k, v = (torch.zeros(shape, device=device, dtype=cache) for _ in range(2))
        return KVCache(k=k, v=v, **self.step_weights(dtype, batch))

    def step(self, x_t, state):                              # x_t (N, D)
        N, H, E = x_t.shape[0], self.n_heads, self.head_dim
        q, k, v = dense(x_t, state.qkv).view(N, 3, H, 1, E).unbind(1)             # (N, H, 1, E)
        t = state.t
        state.k[:, :, t] = k[:, :, 0]
        state.v[:, :, t] = v[:, :, 0]
        state.t = t + 1
        y = F.scaled_dot_product_attention(q.to(state.k.dtype), state.k[:, :, :t + 1], state.v[:, :, :t + 1])
        return self.merge_step(y, state), state
