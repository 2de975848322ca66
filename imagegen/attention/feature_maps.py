"""Feature maps phi of the linear attention, chosen by name (`model.attention_options.feature_map`).

A map takes queries or keys x (N, H, L, E) -> features (N, H, L, F); the attention then is
phi(q_i) . sum_{j<=i} phi(k_j) v_j^T / (phi(q_i) . sum_{j<=i} phi(k_j) + eps).
  elu    elu(x) + 1 > 0 (Katharopoulos et al. 2020; F = E). The fused kernels apply it themselves.
  relu   max(x, 0) >= 0 (F = E); a position whose features are all 0 reads 0.
  favor  Performer's FAVOR+ (Choromanski et al. 2021): positive random features
         exp(w . u - |u|^2 / 2) / sqrt(F) with u = x / E^(1/4) and F rows w drawn in orthogonal
         blocks of E, each row rescaled to the norm of a Gaussian vector; phi(q) . phi(k) is an
         unbiased estimate of exp(q . k / sqrt(E)), softmax attention's kernel. Always > 0
         (the exponent is at most |w|^2 / 2, so it cannot overflow; it can underflow for huge |u|).
  rff    random Fourier features as random feature attention uses them (Peng et al. 2021):
         u = tau_h x / |x| (unit length, times a learned per-head tau, init 1, at most 8) and
         exp(|u|^2 / 2) / sqrt(F / 2) [sin(W u), cos(W u)] with W (F / 2, E) Gaussian, an unbiased
         estimate of exp(u_q . u_k), the softmax kernel of the normalised inputs. Not positive:
         the denominator is only positive on average (why FAVOR+ was made).
Random maps keep their draw as a buffer (`omega`, (E, F) or (E, F / 2)), so that it is saved in
the checkpoint and training, evaluation, sampling and export use the same one. The first draw
comes from torch's global generator (seeded by the run's seed before the model is built);
with redraw_every = R > 0 the map draws again every R training forwards (Performer's practice)
from a generator seeded by its own `draw_seed` buffer and the count (`calls` buffer), the same
on every process, and the draw in force is the one saved.
Shape letters: N batch, H heads, L length, E head dim, F features.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UserError

FEATURE_MAPS = {}
MAX_LOG_TAU = math.log(8.0)  # rff: tau <= 8 keeps exp(tau^2 / 2) finite in float32


def register(name):
    def wrap(cls):
        FEATURE_MAPS[name] = cls
        cls.name = name
        return cls
    return wrap


def make_feature_map(name, n_heads, head_dim, n_features=None, redraw_every=0):
    """The map `name` for H = n_heads heads of dim E = head_dim; n_features (F) and redraw_every
    only for the random maps (None: their default)."""
    if name not in FEATURE_MAPS:
        raise UserError(f"unknown feature_map {name!r}; choose one of {', '.join(FEATURE_MAPS)} "
                        f"(model.attention_options.feature_map).")
    cls = FEATURE_MAPS[name]
    if not cls.random:
        if n_features is not None or redraw_every:
            raise UserError(f"feature_map={name} has no random features; drop model.attention_options.n_features "
                            f"and redraw_every, or pick feature_map=favor or rff.")
        return cls(n_heads, head_dim)
    n_features = cls.default_features if n_features is None else n_features
    if not isinstance(n_features, int) or n_features < cls.feature_step or n_features % cls.feature_step:
        raise UserError(f"n_features={n_features!r} does not fit feature_map={name}: it takes a positive multiple "
                        f"of {cls.feature_step}; pass model.attention_options.n_features=N.")
    if not isinstance(redraw_every, int) or redraw_every < 0:
        raise UserError(f"redraw_every={redraw_every!r} must be an int >= 0 (0: never redraw).")
    return cls(n_heads, head_dim, n_features, redraw_every)


class FeatureMap(nn.Module):
    """Base: n_out (F), `positive` (features > 0 promised), `random` (has a draw)."""
    random = False
    positive = True

    def __init__(self, n_heads, head_dim):
        super().__init__()
        self.n_heads, self.head_dim, self.n_out = n_heads, head_dim, head_dim

    def step_form(self, dtype):
        """The map as the one-call C++ decoding step computes it, with features of `dtype` (`ops.decode_step`'s
        features and a layer's tensor for it, csrc/decode_step.cpp's step_features), or None where that
        step cannot (rff)."""
        return None


@register("elu")
class Elu(FeatureMap):
    """elu(x) + 1."""

    def forward(self, x):
        return F.elu(x) + 1

    def step_form(self, dtype):
        return "elu", None                                   # the fused attention applies it itself


@register("relu")
class Relu(FeatureMap):
    """max(x, 0): non-negative, zero for half of the inputs."""

    def forward(self, x):
        return F.relu(x)

    def step_form(self, dtype):
        return "relu", None


class RandomMap(FeatureMap):
    """Base of the random maps: the draw `omega` (a buffer), redrawing, the `features` estimator."""
    random = True
    default_features = 64
    feature_step = 1

    def __init__(self, n_heads, head_dim, n_features, redraw_every):
        super().__init__(n_heads, head_dim)
        self.n_out, self.redraw_every = n_features, redraw_every
        self.register_buffer("omega", self.draw(None))
        if redraw_every:
            # floats: a checkpoint holds float tensors only; exact integers up to 2^53
            self.register_buffer("draw_seed", torch.tensor(float(torch.randint(2 ** 31, ()).item()),
                                                           dtype=torch.float64))
            self.register_buffer("calls", torch.zeros((), dtype=torch.float64))

    def draw(self, generator):
        raise NotImplementedError

    def redraw(self):
        """A new draw in place, from a generator seeded by draw_seed and the count of forwards."""
        gen = torch.Generator().manual_seed(int(self.draw_seed.item()) + int(self.calls.item()))
        self.omega.copy_(self.draw(gen))

    def count_forward(self):
        """Call once per training forward: redraw every redraw_every calls (not on the first)."""
        if not self.redraw_every:
            return
        self.calls += 1
        if int(self.calls.item()) % self.redraw_every == 0:
            self.redraw()

    def extra_repr(self):
        return f"E={self.head_dim}, F={self.n_out}, redraw_every={self.redraw_every}"


def orthogonal_gaussian(rows, dim, generator):
    """(rows, dim): blocks of dim orthonormal rows (QR of a Gaussian matrix), each row rescaled to
    the norm of a dim-dimensional Gaussian vector, so that rows are marginally Gaussian (FAVOR+)."""
    blocks = []
    for _ in range(math.ceil(rows / dim)):
        q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
        blocks.append(q.T)
    norms = torch.randn(rows, dim, generator=generator, dtype=torch.float64).norm(dim=1, keepdim=True)
    return (torch.cat(blocks)[:rows] * norms).float()


@register("favor")
class Favor(RandomMap):
    """FAVOR+ positive orthogonal random features (see the module docstring).
    Args: n_heads, head_dim (E), n_features (F, default 64), redraw_every (0)."""

    def draw(self, generator):
        return orthogonal_gaussian(self.n_out, self.head_dim, generator).T.contiguous()      # (E, F)

    def features(self, u):
        """exp(u . w - |u|^2 / 2) / sqrt(F): phi(a) . phi(b) estimates exp(a . b) without bias."""
        proj = u @ self.omega.to(u.dtype)                                                # (..., F)
        return torch.exp(proj - 0.5 * (u * u).sum(-1, keepdim=True)) / math.sqrt(self.n_out)

    def forward(self, x):                                                                # (N, H, L, E)
        """features(x c), c = E^-1/4, as one product and one exp: exp(x (c w) + b), b = -c^2 |x|^2 / 2 - log(F) / 2
        added by the product (addmm), the exp in place: fewer passes over the (N, H, L, F) output than
        `features`' (docs/notes/code-measurements.md)."""
        c, rows = self.head_dim ** -0.25, x.reshape(-1, self.head_dim)
        b = (rows * rows).sum(-1, keepdim=True) * (-0.5 * c * c) - 0.5 * math.log(self.n_out)
        return torch.addmm(b, rows, self.scaled_draw(x.dtype)).exp_().view(*x.shape[:-1], self.n_out)

    def scaled_draw(self, dtype):
        """c w (E, F) in dtype, c = E^-1/4: what forward multiplies x by."""
        return self.omega.to(dtype) * self.head_dim ** -0.25

    def step_form(self, dtype):
        return "favor", self.scaled_draw(dtype)                 # once per decoding state, not per step


@register("rff")
class RandomFourier(RandomMap):
    """Random Fourier features of random feature attention (see the module docstring).
    Args: n_heads, head_dim (E), n_features (F, even, default 64: F / 2 frequencies), redraw_every (0)."""
    positive = False
    feature_step = 2

    def __init__(self, n_heads, head_dim, n_features, redraw_every):
        super().__init__(n_heads, head_dim, n_features, redraw_every)
        self.log_tau = nn.Parameter(torch.zeros(n_heads))

    def draw(self, generator):
        return torch.randn(self.head_dim, self.n_out // 2, generator=generator)            # (E, F / 2)

    def features(self, u):
        """exp(|u|^2 / 2) [sin(u W), cos(u W)] / sqrt(F / 2): phi(a) . phi(b) estimates exp(a . b)."""
        proj = u @ self.omega.to(u.dtype)                                                # (..., F / 2)
        scale = torch.exp(0.5 * (u * u).sum(-1, keepdim=True)) / math.sqrt(self.n_out // 2)
        return torch.cat([torch.sin(proj), torch.cos(proj)], -1) * scale

    def forward(self, x):                                                                # (N, H, L, E)
        tau = self.log_tau.clamp(max=MAX_LOG_TAU).exp().to(x.dtype).view(-1, 1, 1)       # (H, 1, 1)
        return self.features(F.normalize(x, dim=-1) * tau)
