"""Output distributions over a byte (0..255): negative log-likelihood in nats and sampling.

Each head turns P parameters per sub-pixel into a distribution over the 256 values:
- `Categorical`: P = 256 logits.
- `LogisticMixture`: P = 3K (K mixture logits, K means, K log-scales), a discretized
  mixture of logistics on [-1, 1] with PixelCNN++ edges: value 0 takes the mass from
  -inf, 255 the mass to +inf; log-scales clamped at -7.
Sampling draws from `probs`, which tests tie to `log_prob`, the distribution the loss scores.
"""
import functools
import math

import torch
import torch.nn.functional as F

from ..errors import UserError
from ..ops.build import draw_kernel

VALUES = torch.arange(256)
EDGES = (torch.arange(255) + 0.5) / 127.5 - 1          # inner bin edges on [-1, 1]


@functools.lru_cache(maxsize=None)
def constants(device):
    """(VALUES, EDGES) on `device`, copied there once (a copy at every call was two host-to-device
    transfers a decoding step on a GPU), outside inference mode: a copy first made while sampling
    serves training too."""
    with torch.inference_mode(False):
        return VALUES.to(device), EDGES.to(device)


class Categorical:
    name = "categorical"

    def __init__(self):
        self.n_params = 256

    def log_prob(self, params, x):
        """params (..., 256), x (...) integer -> log p(x) in nats, shape (...)."""
        return F.log_softmax(params.float(), dim=-1).gather(-1, x.long().unsqueeze(-1)).squeeze(-1)

    def log_probs(self, params):
        """params (..., P) -> log p over all 256 values, (..., 256)."""
        return F.log_softmax(params.float(), dim=-1)

    def probs(self, params):
        """params (B, P) -> p over all 256 values (B, 256), for sampling."""
        return torch.softmax(params.float(), dim=-1)


class LogisticMixture:
    name = "mixture"
    MIN_LOG_SCALE = -7.0

    def __init__(self, n_mixtures=10):
        self.n_mixtures = n_mixtures
        self.n_params = 3 * n_mixtures

    def _component_log_prob(self, params, x):
        """params (..., 3K), x (...) -> per-component log p(x), (..., K)."""
        logits, mean, log_scale = params.float().chunk(3, dim=-1)
        log_scale = log_scale.clamp(min=self.MIN_LOG_SCALE)
        xf = x.to(mean.dtype).unsqueeze(-1)
        centered = xf / 127.5 - 1.0 - mean
        inv_s = torch.exp(-log_scale)
        plus_in = inv_s * (centered + 1.0 / 255)
        min_in = inv_s * (centered - 1.0 / 255)
        log_cdf_plus = plus_in - F.softplus(plus_in)           # log sigmoid(plus_in): mass below the bin's top
        log_one_minus_cdf_min = -F.softplus(min_in)            # log (1 - sigmoid(min_in)): mass above its bottom
        cdf_delta = torch.sigmoid(plus_in) - torch.sigmoid(min_in)
        mid_in = inv_s * centered
        log_pdf_mid = mid_in - log_scale - 2.0 * F.softplus(mid_in)
        # tiny bins: density at the centre times the bin width (PixelCNN++'s approximation)
        inner = torch.where(cdf_delta > 1e-5, torch.log(cdf_delta.clamp(min=1e-12)), log_pdf_mid - math.log(127.5))
        log_p = torch.where(xf < 0.5, log_cdf_plus, torch.where(xf > 254.5, log_one_minus_cdf_min, inner))
        return log_p + F.log_softmax(logits, dim=-1)

    def log_prob(self, params, x):
        return torch.logsumexp(self._component_log_prob(params, x), dim=-1)

    def probs(self, params):
        """params (B, 3K) -> p over all 256 values (B, 256), for sampling: the mixture's CDF at the
        255 inner bin edges (PixelCNN++ edges: bins 0 and 255 reach to -inf and +inf), differenced.
        Equals exp(log_probs) up to the tiny-bin approximation that log_prob makes (< 1e-4 in total).
        On the CPU, wherever the kernel builds (`draw_kernel`), its `mixture_probs` computes it (within float32
        rounding of `probs_reference`, and faster: docs/notes/code-measurements.md); a machine draws through
        one of the two whatever ran before, so one seed draws the same bytes."""
        if params.device.type == "cpu" and (kernel := draw_kernel()) is not None:
            return kernel.mixture_probs(params.float().contiguous())
        return self.probs_reference(params)

    def probs_reference(self, params, dtype=torch.float32):
        """`probs` in PyTorch (any device), computed in dtype (float64: the tests' reference for the kernel)."""
        logits, mean, log_scale = params.to(dtype).chunk(3, dim=-1)                # (B, K) each
        edges = constants(params.device)[1].to(dtype)                              # (255,)
        inv_s = torch.exp(-log_scale.clamp(min=self.MIN_LOG_SCALE)).unsqueeze(-1)
        cdf = torch.sigmoid((edges - mean.unsqueeze(-1)) * inv_s)                 # (B, K, 255)
        cdf = torch.softmax(logits, dim=-1).unsqueeze(1) @ cdf                     # (B, 1, 255) mixture CDF
        cdf = F.pad(F.pad(cdf.squeeze(1), (1, 0), value=0.0), (0, 1), value=1.0)  # (B, 257): 0, CDF, 1
        return torch.diff(cdf, dim=-1)

    def log_probs(self, params):
        values = constants(params.device)[0].view(*([1] * (params.dim() - 1)), 256)
        values = values.expand(*params.shape[:-1], 256)
        return self.log_prob(params.unsqueeze(-2), values)


def make_head(name, n_mixtures=10):
    if name == "mixture":
        return LogisticMixture(n_mixtures)
    if name == "categorical":
        return Categorical()
    raise UserError(f"unknown output head {name!r}; choose model.head=mixture or model.head=categorical.")


GUIDANCE_BOUND = 0.5   # B: above G = 1, log p_c - log p_u is clamped to [-B, B] per value (docs/guidance.md)


def guided_probs(head, params, params_uncond=None, guidance=1.0):
    """p over the 256 values (B, 256) from params (B, P) with classifier-free guidance G, given the
    unconditional branch's params_uncond (B, P). G <= 1: p_c^G p_u^(1-G), normalised (G = 1 is p_c,
    G = 0 p_u). G > 1 leans further towards the class, boundedly: p_c exp((G-1) clamp(log p_c -
    log p_u, -B, B)), normalised, so no value gains more than e^((G-1)B) over p_c and a value the
    class itself finds unlikely cannot be drawn up from the tails (the unbounded p_c^G p_u^(1-G)
    did that over hundreds of steps: streaks and speckles). Where the CPU kernel builds (`draw_kernel`), its
    `guided_probs` combines float32 CPU rows in one call (within float32 rounding of `guided_probs_reference`)."""
    p = head.probs(params)
    if params_uncond is None or guidance == 1.0:
        return p
    p_u = head.probs(params_uncond)
    kernel = draw_kernel() if p.device.type == "cpu" and p.dtype == p_u.dtype == torch.float32 else None
    if kernel is not None:
        return kernel.guided_probs(p.contiguous(), p_u.contiguous(), float(guidance), GUIDANCE_BOUND)
    return guided_probs_reference(p, p_u, guidance)


def guided_probs_reference(p, p_u, guidance):
    """`guided_probs` from the two branches' probabilities p, p_u (B, 256), in PyTorch (any device, dtype)."""
    tiny = torch.finfo(p.dtype).tiny
    log_c, log_u = torch.log(p.clamp_min(tiny)), torch.log(p_u.clamp_min(tiny))
    ratio = log_c - log_u
    if guidance > 1:
        ratio = ratio.clamp(-GUIDANCE_BOUND, GUIDANCE_BOUND)
    return torch.softmax(log_c + (guidance - 1) * ratio, dim=-1)


def sample(head, params, temperature=1.0, generator=None, uniforms=None, params_uncond=None, guidance=1.0):
    """Draw one byte per row of params (B, P) from the head's probabilities (guided by params_uncond
    as in `guided_probs` when given), sharpened as p^(1/temperature). Inverse CDF with one uniform
    per row, so two samplers that compute the same probabilities draw the same bytes. uniforms (B,)
    in [0, 1), if given, are those draws (the browser sampler's exactness tests); otherwise they
    come from `generator`."""
    if temperature <= 0:
        raise UserError(f"temperature must be > 0 (got {temperature}); use 1.0 for the model's own distribution.")
    p = guided_probs(head, params, params_uncond, guidance)
    if temperature != 1.0:
        p = torch.softmax(torch.log(p.double()) / temperature, dim=-1)
    if uniforms is None:
        u = torch.rand(len(p), 1, generator=generator, dtype=p.dtype, device=p.device)
    else:
        u = torch.as_tensor(uniforms, dtype=p.dtype, device=p.device).reshape(len(p), 1)
    if p.device.type == "cpu" and p.dtype == torch.float32 and (kernel := draw_kernel()) is not None:
        return kernel.inverse_cdf(p.contiguous(), u.contiguous())   # the reference's lines, in one call
    return inverse_cdf_reference(p, u)


def inverse_cdf_reference(p, u):
    """The byte each uniform of u (B, 1) draws from p (B, 256): the first value whose running sum reaches
    u * the row's total (at most 255). On the CPU the kernel's `inverse_cdf` does this for float32 p (`draw_kernel`)."""
    cdf = p.cumsum(dim=-1)
    return torch.searchsorted(cdf, u * cdf[:, -1:]).clamp(max=255).squeeze(-1).to(torch.uint8)
