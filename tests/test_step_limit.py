"""The sampling table's "share of limit": a decoding step's FLOPs and bytes counted by hand for a
tiny model, and the share from given rates."""
import pytest
import torch

from imagegen.benchmarks import step_limit
from fixtures import tiny_model


def tiny():
    return tiny_model("linear", head="categorical")


def test_step_cost_counts_the_products_and_the_state():
    weights = 16 * 48 + 16 * 16 + 16 * 32 + 32 * 16 + 16 * 256      # qkv, out, ff1, ff2, head: 6,144
    state = 2 * 8 * 9 * 3                                           # H E (E + 1) per image, batch 3
    assert step_limit.step_cost(tiny(), 3) == (2 * 3 * weights + 4 * state, 4 * weights + 2 * 4 * state)
    flops, moved = step_limit.step_cost(tiny(), 3, torch.bfloat16)
    assert moved == 2 * weights + 2 * 4 * state                     # bfloat16 weights, float32 state


def test_share_is_the_limit_over_the_measured_step(monkeypatch):
    monkeypatch.setattr(step_limit, "machine_rates", lambda *a: (1e9, 2e9))
    flops, moved = step_limit.step_cost(tiny(), 4)
    assert step_limit.limit_share(tiny(), 4, 1e-3) == pytest.approx((flops / 1e9 + moved / 2e9) / 1e-3)


def test_machine_rates_are_positive_and_cached():
    rates = step_limit.machine_rates(16, torch.float32, 1)
    assert all(r > 0 for r in rates) and step_limit.machine_rates(16, torch.float32, 1) is rates
