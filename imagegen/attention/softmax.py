"""Softmax attention: torch's scaled_dot_product_attention, causal; steps with a preallocated KV cache."""
import torch
import torch.nn.functional as F

from ..layers import Dense
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
        """A K/V cache of max_len positions allocated once and written in place."""
        shape = (batch, self.n_heads, max_len, self.head_dim)
        return {"k": torch.zeros(shape, device=device, dtype=dtype),
                "v": torch.zeros(shape, device=device, dtype=dtype), "t": 0}

    def step(self, x_t, state):                              # x_t (N, D)
        q, k, v = (self.split(t) for t in self.qkv(x_t[:, None]).chunk(3, dim=-1))   # (N, H, 1, E)
        t = state["t"]
        state["k"][:, :, t] = k[:, :, 0]
        state["v"][:, :, t] = v[:, :, 0]
        state["t"] = t + 1
        y = F.scaled_dot_product_attention(q, state["k"][:, :, :t + 1], state["v"][:, :, :t + 1])
        return self.merge(y)[:, 0], state
