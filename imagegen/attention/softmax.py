"""Softmax attention: torch's scaled_dot_product_attention, causal; steps with a preallocated KV cache
(of the decoding dtype: bfloat16 decoding keeps keys and values in bfloat16, halving the cache)."""
import torch
import torch.nn.functional as F

from ..layers import Dense, dense
from . import Attention, register


@register("softmax")
class SoftmaxAttention(Attention):
    """Exact causal softmax attention. Args: d_model, n_heads."""

    def __init__(self, d_model, n_heads):
        super().__init__(d_model, n_heads)
        self.qkv = Dense(d_model, 3 * d_model)

    def forward(self, x):                                    # x (N, L, D)
        q, k, v = (self.split(t) for t in self.qkv(x).chunk(3, dim=-1))   # (N, H, L, E)
        return self.merge(F.scaled_dot_product_attention(q, k, v, is_causal=True))

    def init_state(self, batch, max_len, device, dtype):
        """A K/V cache of max_len positions in dtype, allocated once and written in place."""
        shape = (batch, self.n_heads, max_len, self.head_dim)
        return {"k": torch.zeros(shape, device=device, dtype=dtype),
                "v": torch.zeros(shape, device=device, dtype=dtype), "t": 0, **self.step_weights(dtype)}

    def step(self, x_t, state):                              # x_t (N, D)
        N, H, E = x_t.shape[0], self.n_heads, self.head_dim
        q, k, v = dense(x_t, state["qkv"]).view(N, 3, H, 1, E).unbind(1)          # (N, H, 1, E)
        t = state["t"]
        state["k"][:, :, t] = k[:, :, 0]
        state["v"][:, :, t] = v[:, :, 0]
        state["t"] = t + 1
        y = F.scaled_dot_product_attention(q, state["k"][:, :, :t + 1], state["v"][:, :, :t + 1])
        return self.merge_step(y, state), state
