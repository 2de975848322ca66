"""Linear attention with phi(x) = elu(x) + 1 (Katharopoulos et al. 2020).

Causal forward through `imagegen.ops.causal_linear_attention`; as an RNN, each step
updates S = sum phi(k) v^T (E x M) and Z = sum phi(k) (E) and reads them with phi(q)."""
import torch
import torch.nn.functional as F
from torch import nn

from ..ops import EPS, causal_linear_attention
from . import Attention, register


def phi(x):
    return F.elu(x) + 1


@register("linear")
class LinearAttention(Attention):
    """Args: d_model, n_heads, impl ('auto' or an `imagegen.ops` implementation name)."""

    def __init__(self, d_model, n_heads, impl="auto"):
        super().__init__(d_model, n_heads)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.impl = impl

    def forward(self, x):                                    # x (N, L, D)
        q, k, v = (self.split(t) for t in self.qkv(x).chunk(3, dim=-1))   # (N, H, L, E)
        return self.merge(causal_linear_attention(phi(q), phi(k), v, impl=self.impl))

    def init_state(self, batch, max_len, device, dtype):
        """Constant-size state whatever max_len: S (N, H, E, M) and Z (N, H, E)."""
        H, E = self.n_heads, self.head_dim
        return {"S": torch.zeros(batch, H, E, E, device=device, dtype=dtype),
                "Z": torch.zeros(batch, H, E, device=device, dtype=dtype)}

    def step(self, x_t, state):                              # x_t (N, D)
        N = x_t.shape[0]
        q, k, v = self.qkv(x_t).view(N, 3, self.n_heads, self.head_dim).unbind(1)   # (N, H, E)
        q, k = phi(q), phi(k)
        S, Z = state["S"], state["Z"]
        S.add_(k.unsqueeze(-1) * v.unsqueeze(-2))            # S += phi(k) v^T
        Z.add_(k)                                            # Z += phi(k)
        num = torch.einsum("nhe,nhem->nhm", q, S)
        den = (q * Z).sum(-1, keepdim=True) + EPS
        return self.out((num / den).reshape(N, -1)), state
