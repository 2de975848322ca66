"""Linear attention with phi(x) = elu(x) + 1 (Katharopoulos et al. 2020).

Causal forward through `imagegen.ops.linear_attention_qkv` (fused CPU kernel, Triton on CUDA,
or chunked); as an RNN, each step updates S = sum phi(k) v^T (E x M) and Z = sum phi(k) (E) and
reads them with phi(q).
Where the fused CPU kernel serves the model, a decoding step is that kernel run for one
position from the carried state; elsewhere Z is kept as an extra column of S (v gets a ones
column), so one batched product serves both: Triton's step kernel (where Triton serves the
forward) or PyTorch's baddbmm and bmm.
With bfloat16 decoding (dtype=bfloat16 in init_state) the projections run in bfloat16 and S, Z
stay float32: the fused kernel widens q, k, v as it reads them, the loop here converts them."""
import torch
import torch.nn.functional as F

from ..errors import UserError
from ..ops import (EPS, IMPLS, compute_dtype, fused_state, fused_step, linear_attention_qkv, phi, triton_step,
                   uses_fused_kernel, uses_triton_step)
from ..layers import Dense, dense
from . import Attention, register


@register("linear")
class LinearAttention(Attention):
    """Args: d_model, n_heads, impl ('auto' or an `imagegen.ops` implementation name)."""

    def __init__(self, d_model, n_heads, impl="auto"):
        super().__init__(d_model, n_heads)
        if impl not in IMPLS:
            raise UserError(f"unknown linear attention impl {impl!r}; choose one of {', '.join(IMPLS)} "
                            f"(model.attention_options.impl).")
        self.qkv = Dense(d_model, 3 * d_model)
        self.impl = impl

    def forward(self, x):                                    # x (N, L, D)
        return self.out(linear_attention_qkv(self.qkv(x), self.n_heads, impl=self.impl))

    def init_state(self, batch, max_len, device, dtype):
        """Constant-size state whatever max_len: the fused kernel's (N*H, S and z), else
        S (N*H, E, M+1) whose last column is Z; both float32 for bfloat16 products."""
        like, NH, E = torch.empty(0, device=device, dtype=dtype), batch * self.n_heads, self.head_dim
        weights = self.step_weights(dtype, batch)
        if uses_fused_kernel(self.impl, like):
            return {"fused": fused_state(like, NH, E, E), **weights}
        S = torch.zeros(NH, E, E + 1, device=device, dtype=compute_dtype(like))
        return {"S": S, "triton": True, **weights} if uses_triton_step(self.impl, S) else {"S": S, **weights}

    def step(self, x_t, state):                              # x_t (N, D)
        N, H, E = x_t.shape[0], self.n_heads, self.head_dim
        if "fused" in state:
            q, k, v = dense(x_t, state["qkv"]).view(N, 3, H, 1, E).unbind(1)       # (N, H, 1, E) views
            return self.merge_step(fused_step(q, k, v, state["fused"], EPS), state), state
        S = state["S"]
        if state.get("triton"):                              # the same S, Z by one Triton kernel
            q, k, v = dense(x_t, state["qkv"]).view(N, 3, H, 1, E).to(S.dtype).unbind(1)
            return self.merge_step(triton_step(q, k, v, S, EPS), state), state
        qkv = dense(x_t, state["qkv"]).view(N, 3, H, E).to(S.dtype)
        qk = phi(qkv[:, :2])                                 # (N, 2, H, E)
        v1 = F.pad(qkv[:, 2], (0, 1), value=1.0)             # (N, H, M+1): v with a ones column
        S.baddbmm_(qk[:, 1].reshape(N * H, E, 1), v1.reshape(N * H, 1, E + 1))   # S += phi(k) [v, 1]^T
        o = torch.bmm(qk[:, 0].reshape(N * H, 1, E), S).view(N, H, E + 1)      # [phi(q) S, phi(q) Z]
        return self.merge_step(o[..., :E] / (o[..., E:] + EPS), state), state
