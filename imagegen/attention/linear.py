"""Linear attention: phi(q) . sum phi(k) v^T / phi(q) . sum phi(k) (Katharopoulos et al. 2020),
with a choice of feature map phi (feature_maps.py; elu + 1 by default) and an optional recency
gate (random feature attention, Peng et al. 2021).

Causal forward: with elu + 1 and no gate, through `imagegen.ops.linear_attention_qkv` (fused
CPU kernel, Triton on CUDA, or chunked), which applies phi itself; with another map the features
are computed here in PyTorch (float32) and go to `ops.mapped_linear_attention` (the fused CPU
kernel or Triton, either with phi the identity, or chunked); with a gate to
`ops.gated_linear_attention` (chunked form carrying the decay). As an RNN, each step updates
S = sum phi(k) v^T (F x M) and Z = sum phi(k) (F) and reads them with phi(q); gated,
S_t = g_t S_{t-1} + (1 - g_t) phi(k_t) v_t^T and the same for Z, g_t in (0, 1) per head: one
learned value per head (gate=head) or sigmoid of a projection of the layer's input (gate=input,
the paper's). Where the fused CPU kernel serves the model (no gate; another map's features given
to it as they are, phi the identity), a decoding step is that kernel run for one position from the
carried state; elsewhere Z is kept as an extra column of S (v gets a ones column), so one batched
product serves both: Triton's step kernel (ungated, where Triton serves the forward) or PyTorch's
baddbmm and bmm.
With bfloat16 decoding (dtype=bfloat16 in init_state) the projections run in bfloat16 and S, Z
stay float32: the fused kernel widens q, k, v as it reads them, the loop here converts them."""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import LinearOptions
from ..dtypes import activation_dtype
from ..errors import UserError
from ..ops import (EPS, IMPLS, compute_dtype, fused_state, fused_step, gated_linear_attention, gated_step,
                   linear_attention_qkv, mapped_linear_attention, triton_step, uses_fused_kernel, uses_triton_step)
from ..ops.dense import Dense, dense
from .base import Attention, AttentionState
from .feature_maps import make_feature_map
from .registry import register


@dataclass
class LinearState(AttentionState):
    """The running sums of one linear-attention layer, in the form its steps run:
    form "fused": S is the fused C++ kernel's own state (S and z of each of N*H heads, `ops.fused_state`);
    form "mapped": the same for another map's features (F x M), computed at each step by the map (in the
        module loop) or by the one-call C++ step (relu and favor, `step_form`);
    form "triton" or "torch": S (N*H, F, M+1) with Z as its last column, stepped by Triton's kernel or
    by PyTorch's products. Float32 for bfloat16 products."""
    S: torch.Tensor
    form: str = "torch"

GATES = ("none", "head", "input")
HALF_LIVES = (4.0, 1024.0)  # initial gates: half-lives (positions) log-spaced over the heads between these


def feature_dtype(x):
    """Features and sums in float32 for half inputs (on any device), else in x's dtype."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


@register("linear")
class LinearAttention(Attention):
    """Args: d_model, n_heads, and the options of `LinearOptions` (imagegen/config/schema.py) as keywords: impl
    ('auto' or an `imagegen.ops` implementation name), feature_map ('elu' (default), 'relu', 'favor',
    'rff'; see feature_maps.py), n_features (F of the random maps; default 64), redraw_every (random
    maps: a new draw every this many training forwards; 0: never), gate ('none' (default), 'head' or
    'input')."""
    Options = LinearOptions

    def __init__(self, d_model, n_heads, **options):
        super().__init__(d_model, n_heads)
        o = self.parse_options(options)
        impl, feature_map, n_features, redraw_every, gate = (o.impl, o.feature_map, o.n_features, o.redraw_every,
                                                             o.gate)
        if impl not in IMPLS:
            raise UserError(f"unknown linear attention impl {impl!r}; choose one of {', '.join(IMPLS)} "
                            f"(model.attention_options.impl).")
        if gate not in GATES:
            raise UserError(f"unknown gate {gate!r}; choose one of {', '.join(GATES)} (model.attention_options.gate).")
        self.qkv = Dense(d_model, 3 * d_model)
        self.impl, self.gate = impl, gate
        self.feature_map = make_feature_map(feature_map, n_heads, self.head_dim, n_features, redraw_every)
        # elu + 1 without a gate: the fused kernels, which apply phi themselves (and old checkpoints)
        self.plain_elu = feature_map == "elu" and gate == "none"
        if gate != "none":
            lives = torch.logspace(math.log10(HALF_LIVES[0]), math.log10(HALF_LIVES[1]), n_heads)
            g = 0.5 ** (1 / lives)
            logits = torch.log(g / (1 - g))                                        # sigmoid(logits) = g
            if gate == "head":
                self.gate_logit = nn.Parameter(logits)
            else:
                self.gate_proj = Dense(d_model, n_heads)
                with torch.no_grad():
                    self.gate_proj.bias.copy_(logits)

    def gate_logits(self, x):
        """x (..., D) -> the gates' logits (..., H): g = sigmoid(logits)."""
        if self.gate == "head":
            return self.gate_logit.expand(*x.shape[:-1], self.n_heads)
        return self.gate_proj(x)

    def forward(self, x):                                    # x (N, L, D)
        if self.plain_elu:
            return self.out(linear_attention_qkv(self.qkv(x), self.n_heads, impl=self.impl))
        if self.training and torch.is_grad_enabled() and self.feature_map.random:
            self.feature_map.count_forward()                 # redraw every redraw_every training steps
        q, k, v = (self.split(t) for t in self.qkv(x).chunk(3, dim=-1))       # (N, H, L, E)
        dtype = feature_dtype(q)
        with torch.autocast(x.device.type, enabled=False):
            fq, fk, v = self.feature_map(q.to(dtype)), self.feature_map(k.to(dtype)), v.to(dtype)  # (N, H, L, F)
            if self.gate == "none":
                y = mapped_linear_attention(fq, fk, v, impl=self.impl)
            else:
                a = self.gate_logits(x).to(dtype).transpose(1, 2)                 # (N, H, L)
                y = gated_linear_attention(fq, fk * torch.sigmoid(-a)[..., None], v, F.logsigmoid(a),
                                           impl=self.impl)
        return self.merge(y)

    def step_form(self, dtype):
        """The feature map as the one-call C++ decoding step takes it, features of `dtype` (`FeatureMap.step_form`),
        or None where it cannot serve this layer (a gate, or a map it does not compute)."""
        return self.feature_map.step_form(dtype) if self.gate == "none" else None

    def init_state(self, batch, max_len, device, dtype):
        """A LinearState of constant size whatever max_len: the fused kernel's forms where it serves
        (no gate: "fused" for elu + 1, "mapped" for another map), else S (N*H, F, M+1) whose last column
        is Z, stepped by Triton or PyTorch. dtype: the products' (dtypes.INT8: int8 products, the sums
        float32)."""
        like, NH, E = torch.empty(0, device=device, dtype=activation_dtype(dtype)), batch * self.n_heads, self.head_dim
        weights = self.step_weights(dtype, batch)
        Fd = self.feature_map.n_out
        state_dtype = compute_dtype(like) if self.plain_elu else feature_dtype(like)   # elu: as before maps existed
        if self.gate == "none" and uses_fused_kernel(self.impl, like):
            if self.plain_elu:
                return LinearState(S=fused_state(like, NH, E, E), form="fused", **weights)
            return LinearState(S=fused_state(like.to(state_dtype), NH, Fd, E), form="mapped", **weights)
        S = torch.zeros(NH, Fd, E + 1, device=device, dtype=state_dtype)
        triton = self.gate == "none" and uses_triton_step(self.impl, S.new_empty(1, 1, 1, max(Fd, E + 1)))
        return LinearState(S=S, form="triton" if triton else "torch", **weights)

    def step(self, x_t, state):                              # x_t (N, D)
        N, H, E = x_t.shape[0], self.n_heads, self.head_dim
        if state.form == "fused":
            q, k, v = dense(x_t, state.qkv).view(N, 3, H, 1, E).unbind(1)          # (N, H, 1, E) views
            return self.merge_step(fused_step(q, k, v, state.S, EPS), state), state
        S = state.S
        qkv = dense(x_t, state.qkv).view(N, 3, H, 1, E).to(S.dtype)
        if state.form == "triton" and self.plain_elu:       # the same S, Z by one Triton kernel, elu inside
            return self.merge_step(triton_step(*qkv.unbind(1), S, EPS), state), state
        qk = self.feature_map(qkv[:, :2].reshape(N * 2, H, 1, E)).view(N, 2, H, 1, -1)  # (N, 2, H, 1, F)
        if state.form == "mapped":                           # the fused kernel, phi the identity
            return self.merge_step(fused_step(qk[:, 0], qk[:, 1], qkv[:, 2], S, EPS, mapped=True), state), state
        if state.form == "triton":                           # features from PyTorch, phi the identity
            return self.merge_step(triton_step(qk[:, 0], qk[:, 1], qkv[:, 2], S, EPS, mapped=True), state), state
        fq, fk, v = qk[:, 0, :, 0], qk[:, 1, :, 0], qkv[:, 2, :, 0]                # (N, H, F), (N, H, M)
        g = None
        if self.gate != "none":
            a = self.gate_logits(x_t).to(S.dtype)                                  # (N, H)
            g, fk = torch.sigmoid(a), fk * torch.sigmoid(-a)[..., None]
        return self.merge_step(gated_step(fq, fk, v, g, S, EPS), state), state
