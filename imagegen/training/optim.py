"""The optimizer a run trains with (train.optimizer); the trainer scales each of its groups' peak by one schedule.

adamw, adam, radam: torch's, over every parameter. muon: torch.optim.Muon over the blocks' matrices
(attention and feed-forward weights, 2-D) and AdamW over the rest (embeddings, biases, LayerNorm, the
output head), as modded-nanogpt splits them: Muon orthogonalises each matrix's momentum, which suits
hidden matrices and not lookups or the head. Muon's step is scaled to AdamW's update size
(adjust_lr_fn="match_rms_adamw"), so train.lr means the same for both parts; train.muon_lr, when set,
is the matrices' own peak. torch's Muon orthogonalises in bfloat16, whose products many CPUs emulate
(tens of times slower than float32): `Muon` below is torch's with that dtype a choice, the run's own
precision (float32 unless it trains under bfloat16 autocast), and torch's update otherwise.
"""
import math

import torch

from ..errors import UserError

KINDS = ("adamw", "adam", "radam", "muon")


def is_hidden_matrix(name, p):
    """Whether Muon trains parameter `name`: a 2-D weight inside a transformer block."""
    return name.startswith("blocks.") and p.ndim == 2


class Muon(torch.optim.Muon):
    """torch.optim.Muon, orthogonalising in `dtype` (torch's: bfloat16); the same state and groups."""

    def __init__(self, params, dtype=torch.bfloat16, **kw):
        super().__init__(params, **kw)
        self.dtype = dtype

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params, grads, bufs = [], [], []
            self._init_group(group, params, grads, bufs)
            for p, grad, buf in zip(params, grads, bufs):
                buf.lerp_(grad, 1 - group["momentum"])
                update = grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.dtype)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-adjusted_lr(group["lr"], group["adjust_lr_fn"], p.shape))


def adjusted_lr(lr, fn, shape):
    """torch's Muon step size for a matrix of `shape`: match_rms_adamw, AdamW's update size; else its original."""
    a, b = shape[:2]
    return lr * (0.2 * math.sqrt(max(a, b)) if fn == "match_rms_adamw" else math.sqrt(max(1, a / b)))


def newton_schulz(g, coefficients, steps, eps, dtype):
    """The quintic Newton-Schulz iteration of torch's Muon (its `_zeropower_via_newtonschulz`) in `dtype`:
    g (A, B) -> about U V^T of g's SVD, (A, B) in dtype."""
    a, b, c = coefficients
    x = g.to(dtype)
    if g.size(0) > g.size(1):
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if g.size(0) > g.size(1) else x


def make_optimizer(model, t, bf16=False):
    """The optimizer of train.optimizer over `model`'s parameters (t: the TrainOptions); bf16: the run
    trains under bfloat16 autocast (Muon then orthogonalises in bfloat16, as torch's does)."""
    kinds = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "radam": torch.optim.RAdam}
    adam = dict(lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay)
    if t.optimizer in kinds:
        return kinds[t.optimizer](model.parameters(), **adam)
    if t.optimizer != "muon":
        raise UserError(f"unknown optimizer {t.optimizer!r}; choose one of {', '.join(KINDS)}.")
    named = list(model.named_parameters())
    hidden = [p for n, p in named if is_hidden_matrix(n, p)]
    rest = [p for n, p in named if not is_hidden_matrix(n, p)]
    muon = Muon(hidden, dtype=torch.bfloat16 if bf16 else torch.float32, lr=t.muon_lr or t.lr,
                weight_decay=t.weight_decay, momentum=t.muon_momentum, adjust_lr_fn="match_rms_adamw")
    return MuonAdamW(muon, torch.optim.AdamW(rest, **adam))


class MuonAdamW:
    """Muon over the hidden matrices and AdamW over the rest, as one optimizer: `param_groups` lists
    both's groups (Muon's first) and `state_dict` is one dict of torch's form, the parameters numbered
    across both, so that checkpoints, their checks and exact resume treat it as any torch optimizer."""

    def __init__(self, muon, adamw):
        self.parts = (muon, adamw)

    @property
    def param_groups(self):
        return [g for part in self.parts for g in part.param_groups]

    def zero_grad(self, set_to_none=True):
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def step(self):
        for part in self.parts:
            part.step()

    def state_dict(self):
        state, groups, offset = {}, [], 0
        for part in self.parts:
            sd = part.state_dict()
            state.update({i + offset: s for i, s in sd["state"].items()})
            groups += [{**g, "params": [i + offset for i in g["params"]]} for g in sd["param_groups"]]
            offset += sum(len(g["params"]) for g in sd["param_groups"])
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, sd):
        groups, offset = list(sd["param_groups"]), 0
        for part in self.parts:
            mine, groups = groups[:len(part.param_groups)], groups[len(part.param_groups):]
            ids = [i for g in mine for i in g["params"]]
            part.load_state_dict({"state": {i - offset: sd["state"][i] for i in ids if i in sd["state"]},
                                  "param_groups": [{**g, "params": [i - offset for i in g["params"]]}
                                                   for g in mine]})
            offset += len(ids)
