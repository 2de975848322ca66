
from types import SimpleNamespace

import pytest
import torch

from imagegen.errors import UserError
from imagegen.model import heads
from imagegen.model.heads import Categorical, LogisticMixture, sample
from fixtures import tiny_model
from imagegen.bits_per_dim import bits_per_dim


def mixture_params(logits, means, log_scales):
    return torch.cat([logits, means, log_scales], dim=-1)


@pytest.mark.parametrize("mean,log_scale", [(0.0, -2.0), (-5.0, 0.0), (5.0, 0.0), (0.3, -7.0), (-0.999, -9.0),
                                            (1.0, -7.0), (0.0, 4.0), (0.0, -4.5)])
def test_mixture_probabilities_sum_to_one_at_extremes(mean, log_scale):
    head = LogisticMixture(3)
    params = mixture_params(torch.tensor([[0.0, 1.0, -2.0]]), torch.full((1, 3), mean),
                            torch.full((1, 3), log_scale)).double()
    assert abs(head.log_probs(params).exp().sum().item() - 1) < 1e-4


def test_mixture_probabilities_sum_to_one_random():
    head = LogisticMixture(10)
    params = torch.randn(200, 30) * 3
    assert (head.log_probs(params).exp().sum(-1) - 1).abs().max() < 1e-4


def test_mixture_edges_take_the_tails():
    head = LogisticMixture(1)
    far_left = mixture_params(torch.zeros(1, 1), torch.full((1, 1), -3.0), torch.full((1, 1), -3.0))
    assert head.log_prob(far_left, torch.tensor([0])).exp().item() > 0.999


def test_log_prob_agrees_with_log_probs():
    head = LogisticMixture(4)
    params = torch.randn(5, 12)
    x = torch.randint(0, 256, (5,))
    assert torch.allclose(head.log_prob(params, x), head.log_probs(params).gather(-1, x[:, None])[:, 0])


def test_uniform_model_scores_exactly_eight_bits():
    model = tiny_model("linear", length=784, width=28, head="categorical")
    torch.nn.init.zeros_(model.proj.weight)
    torch.nn.init.zeros_(model.proj.bias)
    x = torch.randint(0, 256, (5, 784), dtype=torch.uint8)
    assert bits_per_dim(model, x, 2, "cpu") == pytest.approx(8.0, abs=1e-6)


def test_sampling_probs_equal_the_loss_probs():
    head = LogisticMixture(10)
    params = torch.randn(300, 30) * 3
    params[:100, 20:] = -7.0                 # sharp components, where the loss's tiny-bin approximation kicks in
    assert (head.probs(params) - head.log_probs(params).exp()).abs().sum(-1).max() < 1e-4
    cat = Categorical()
    assert torch.allclose(cat.probs(params), cat.log_probs(params).exp())


def extreme_mixtures(n, K, seed=0):
    """(n, 3K) mixture params with sharp and wide components, far means and large logits."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, K, generator=g, dtype=torch.float64) * 4
    logits[::3] *= 12                                    # one component takes (almost) everything
    means = torch.randn(n, K, generator=g, dtype=torch.float64) * 1.5
    means[1::4] = torch.where(means[1::4] > 0, 5.0, -5.0)
    log_scales = torch.rand(n, K, generator=g, dtype=torch.float64) * 9 - 8   # [-8, 1): below the -7 clamp too
    log_scales[2::5] = 5.0
    return torch.cat([logits, means, log_scales], dim=-1)


@pytest.mark.parametrize("K", [1, 5, 10])
@pytest.mark.parametrize("n", [1, 3, 64])
def test_the_cpu_kernels_mixture_probabilities_are_the_references(n, K):
    """`LogisticMixture.probs` on the CPU runs the C++ kernel's mixture_probs: within float32 rounding of
    `probs_reference` computed in float64, at sharp, wide and far components and dominant logits."""
    from fixtures import skip_without_cpu_kernel
    from imagegen.ops.build import kernel_error, load_kernel
    if (why := kernel_error("cpu")) is not None:
        skip_without_cpu_kernel(f"CPU kernel unavailable: {why}")
    head, params = LogisticMixture(K), extreme_mixtures(n, K)
    got = head.probs(params.float())
    assert got.dtype == torch.float32 and got.shape == (n, 256)
    assert torch.equal(got, load_kernel("cpu").mixture_probs(params.float()))
    want = head.probs_reference(params.float(), torch.float64)
    assert want.dtype == torch.float64
    assert (got.double() - want).abs().max() < 1e-6
    assert (got.double().sum(-1) - 1).abs().max() < 1e-6


@pytest.mark.parametrize("guidance", [0.0, 0.5, 2.5])
def test_guided_probabilities_through_the_cpu_kernel_are_as_close_as_pytorchs(guidance):
    """`guided_probs` calls `probs` for both branches: through the kernel it is as close to the same guidance
    in float64 as through `probs_reference` in float32. (Between sharp components far apart, G < 1 weighs
    the float32 tails, floored at the smallest normal float, and both float32 paths are far from float64.)"""
    from fixtures import skip_without_cpu_kernel
    from imagegen.ops.build import kernel_error, load_kernel
    if (why := kernel_error("cpu")) is not None:
        skip_without_cpu_kernel(f"CPU kernel unavailable: {why}")
    head, pc, pu = LogisticMixture(10), extreme_mixtures(8, 10, seed=1).float(), extreme_mixtures(8, 10, seed=2).float()
    assert torch.equal(head.probs(pu), load_kernel("cpu").mixture_probs(pu))
    want = heads.guided_probs_reference(*(head.probs_reference(x, torch.float64) for x in (pc, pu)), guidance)
    via_kernel = (heads.guided_probs(head, pc, pu, guidance).double() - want).abs().max()
    via_reference = (heads.guided_probs_reference(head.probs_reference(pc), head.probs_reference(pu), guidance).double()
                     - want).abs().max()
    assert via_kernel <= 2 * via_reference + 1e-6


@pytest.mark.parametrize("guidance", [0.0, 0.5, 1.5, 3.0, 6.0, 50.0])
def test_the_cpu_kernels_guidance_is_the_references(guidance):
    """`guided_probs` on float32 CPU rows runs the kernel's guided_probs (its own vector log and exp): as close
    to `guided_probs_reference` in float64 as PyTorch's float32 form is, on rows with zeros, values below the
    smallest normal float, one-hot rows and peaked and flat ones; a NaN makes its row NaN, as in PyTorch."""
    from fixtures import skip_without_cpu_kernel
    from imagegen.ops.build import kernel_error, load_kernel
    if (why := kernel_error("cpu")) is not None:
        skip_without_cpu_kernel(f"CPU kernel unavailable: {why}")
    g = torch.Generator().manual_seed(0)
    pc, pu = (torch.softmax(torch.randn(40, 256, generator=g) * torch.rand(40, 1, generator=g) * 12, -1)
              for _ in range(2))
    pc[0, :10], pu[1, 5:20], pc[2, 3], pu[2, 4] = 0, 0, 1e-40, 1e-39
    pc[3], pu[4], pc[5] = 1 / 256, 0, 0
    pu[4, 7], pc[5, 200] = 1, 1
    pc[6, 9] = float("nan")                                   # a NaN spreads over its row, as in PyTorch's softmax
    got = load_kernel("cpu").guided_probs(pc, pu, guidance, heads.GUIDANCE_BOUND)
    assert got[6].isnan().all() and heads.guided_probs_reference(pc, pu, guidance)[6].isnan().all()
    pc, pu, got = pc[torch.arange(40) != 6], pu[torch.arange(40) != 6], got[torch.arange(40) != 6]
    assert torch.equal(heads.guided_probs(SimpleNamespace(probs=lambda p: p), pc, pu, guidance), got)
    assert got.isfinite().all()
    want = heads.guided_probs_reference(pc.double(), pu.double(), guidance)
    pytorch = (heads.guided_probs_reference(pc, pu, guidance).double() - want).abs()
    assert ((got.double() - want).abs() <= 2 * pytorch + 1e-7).all()
    assert (got.sum(-1) - 1).abs().max() < 1e-6


def test_the_cpu_kernels_draw_is_the_references_byte_for_byte():
    """`sample` on the CPU draws through the kernel's inverse_cdf: the same bytes as `inverse_cdf_reference`
    (torch's cumsum and searchsorted) for every uniform, at the edges too: u = 0, u near 1, rows whose mass
    sits on one value or ends early, uniforms landing exactly on a running sum."""
    from fixtures import skip_without_cpu_kernel
    from imagegen.ops.build import kernel_error, load_kernel
    if (why := kernel_error("cpu")) is not None:
        skip_without_cpu_kernel(f"CPU kernel unavailable: {why}")
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(600, 256, generator=g) * 3, -1)
    p[::7, 100:] = 0
    p[1::9] = 0
    p[1::9, 37] = 1
    p[2::11] = 1 / 256
    u = torch.rand(600, 1, generator=g)
    u[::13], u[5::17], u[6::19] = 0.0, 1 - 2 ** -24, 0.5
    got = load_kernel("cpu").inverse_cdf(p, u)
    want = heads.inverse_cdf_reference(p, u)
    assert got.dtype == torch.uint8 and torch.equal(got, want)
    assert torch.equal(sample(Categorical(), torch.log(p), uniforms=u.flatten()),
                       heads.inverse_cdf_reference(torch.softmax(torch.log(p), -1), u))


def test_the_draw_loads_the_kernel_in_a_fresh_process(monkeypatch):
    """The draw's path is one rule (`draw_kernel`: the kernel wherever it builds), not whatever this process
    loaded before: with nothing loaded yet (a softmax model's process), the draw loads the kernel itself."""
    from fixtures import skip_without_cpu_kernel
    from imagegen.ops import build
    if (why := build.kernel_error("cpu")) is not None:
        skip_without_cpu_kernel(f"CPU kernel unavailable: {why}")
    kernel = build._modules["cpu"]
    monkeypatch.setattr(build, "_modules", {})                          # as a fresh process
    monkeypatch.setattr(build, "_build", lambda *a, **k: kernel)
    head, params = LogisticMixture(10), extreme_mixtures(8, 10).float()
    u = torch.rand(8, generator=torch.Generator().manual_seed(3))
    assert torch.equal(sample(head, params, uniforms=u), kernel.inverse_cdf(kernel.mixture_probs(params), u))
    assert build._modules == {"cpu": kernel}


def test_mixture_probabilities_and_draws_fall_back_to_pytorch_without_the_kernel(monkeypatch):
    from fixtures import skip_without_cpu_kernel
    from imagegen.ops.build import kernel_error
    if (why := kernel_error("cpu")) is not None:
        skip_without_cpu_kernel(f"CPU kernel unavailable: {why}")
    head, params = LogisticMixture(10), extreme_mixtures(8, 10).float()
    u = torch.rand(8, generator=torch.Generator().manual_seed(3))
    with_kernel = sample(head, params, uniforms=u)
    monkeypatch.setattr(heads, "draw_kernel", lambda: None)
    assert torch.equal(head.probs(params), head.probs_reference(params))
    assert torch.equal(sample(head, params, uniforms=u), heads.inverse_cdf_reference(head.probs(params), u[:, None]))
    assert (sample(head, params, uniforms=u).long() - with_kernel.long()).abs().max() <= 1   # float32 rounding apart


@pytest.mark.parametrize("head,params", [(LogisticMixture(3), torch.tensor([[0.5, -1.0, 0.0, -0.2, 0.4, 0.9,
                                                                             -2.5, -3.0, -1.5]])),
                                         (Categorical(), torch.randn(1, 256) * 2)])
def test_samples_follow_the_heads_own_probabilities(head, params):
    n = 200_000
    draws = sample(head, params.expand(n, -1), generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(draws.long(), minlength=256).double() / n
    p = head.log_probs(params)[0].exp().double()
    # total variation distance between the empirical and the loss's distribution
    assert 0.5 * (freq - p).abs().sum() < 0.02


def test_low_temperature_is_greedy_and_bad_temperature_is_rejected():
    head = Categorical()
    params = torch.randn(64, 256)
    assert torch.equal(sample(head, params, temperature=1e-4).long(), params.argmax(-1))
    with pytest.raises(UserError, match="temperature"):
        sample(head, params, temperature=0)


def test_head_constants_are_copied_once_and_serve_training():
    """heads.constants keeps one copy per device; one first made under inference mode (sampling) is an
    ordinary tensor, which autograd may save (training)."""
    device = torch.device("meta")
    heads.constants.cache_clear()
    with torch.inference_mode():
        values, edges = heads.constants(device)
    assert not values.is_inference() and not edges.is_inference()
    assert heads.constants(device)[1] is edges and edges.device == device and edges.shape == (255,)
