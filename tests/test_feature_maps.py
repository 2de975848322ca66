"""Feature maps of the linear attention (imagegen/attention/feature_maps.py) and its recency gate
(imagegen/ops/gated_linear.py): every map on every implementation against a float64 quadratic
reference written here (outputs and gradients), step == forward, positivity where promised, the
random maps as unbiased estimates of the softmax kernel, the gate's forms against each other,
and the draw in checkpoints (saved, loaded, redrawn; elu checkpoints without one still load).
"""
import math
import warnings

import pytest
import torch

from imagegen.store import checkpoint
from imagegen import ops
from imagegen.attention import make_attention
from imagegen.attention.feature_maps import FEATURE_MAPS, make_feature_map, orthogonal_gaussian
from imagegen.data.sets import dataset_info
from imagegen.errors import UserError
from imagegen.model.transformer import build_model
from imagegen.ops import build as kernel_mod, triton_linear
from imagegen.ops.gated_linear import gated_chunked, gated_reference, gated_step
from fixtures import skip_without_cpu_kernel

MAPS = sorted(FEATURE_MAPS)
GATES = ["none", "head", "input"]


def quadratic(fq, fk, v, log_g=None, eps=ops.EPS):
    """The float64 reference, written from the definition: out_i = sum_{j<=i} w_ij (fq_i . fk_j) v_j /
    (sum_{j<=i} w_ij (fq_i . fk_j) + eps) with w_ij = prod_{j<r<=i} g_r (1 without a gate)."""
    L = fq.shape[2]
    scores = fq @ fk.transpose(-1, -2)                                          # (N, H, L, L)
    w = torch.ones(L, L, dtype=fq.dtype).tril()
    if log_g is not None:
        c = log_g.cumsum(-1)
        w = torch.where(w.bool(), (c[..., :, None] - c[..., None, :]).clamp(max=0).exp(), 0.0)
    a = scores * w
    return (a @ v) / (a.sum(-1, keepdim=True) + eps)


def raw(N=2, H=3, L=37, E=8, M=5, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(N, H, L, d, generator=gen, dtype=torch.float64).to(dtype) for d in (E, E, M))


def grads_of(fn, *inputs, seed=1):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(out.dtype)
    return (out.detach(), *torch.autograd.grad(out, leaves, g))


def close(got, want, tol):
    for i, (a, b) in enumerate(zip(got, want)):
        err = (a.double().cpu() - b.double().cpu()).abs().max().item() / max(b.abs().max().item(), 1.0)
        assert err < tol, f"item {i} (out, then grads): error {err:.2e} >= {tol}"


@pytest.fixture(scope="module")
def cpu_kernel():
    why = kernel_mod.kernel_error("cpu")
    if why is not None:
        skip_without_cpu_kernel(f"CPU kernel unavailable: {why}")


# ---------------------------------------------------------------- each map on each implementation
@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("impl", ["reference", "cumsum", "chunked", "kernel", "auto"])
def test_forward_matches_float64_quadratic_reference(name, impl, request):
    if impl in ("kernel", "auto"):
        request.getfixturevalue("cpu_kernel")
    torch.manual_seed(0)
    phi = make_feature_map(name, 3, 8, **({"n_features": 16} if FEATURE_MAPS[name].random else {}))
    q, k, v = raw()
    if name == "relu":   # its denominator can come arbitrarily near 0, where float32 sums cannot match
        q, k = q + 0.5, k + 0.5     # float64 (the gradient grows as 1 / den^2): keep it away from 0
    want = grads_of(lambda q, k, v: quadratic(phi.double()(q), phi.double()(k), v), q, k, v)
    phi32 = phi.float()
    got = grads_of(lambda q, k, v: ops.mapped_linear_attention(phi32(q), phi32(k), v, impl=impl),
                   *(t.float() for t in (q, k, v)))
    close(got, want, 1e-4)


@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_step_matches_forward(name, gate, dtype, tol):
    torch.manual_seed(0)
    attn = make_attention("linear", 32, 4, feature_map=name, gate=gate).to(dtype)
    x = torch.randn(3, 41, 32, dtype=dtype)
    state = attn.init_state(3, 41, "cpu", dtype)
    kernel = gate == "none" and kernel_mod.kernel_error("cpu") is None
    assert state.form == (("fused" if name == "elu" else "mapped") if kernel else "torch")
    steps = []
    for t in range(41):
        y_t, state = attn.step(x[:, t], state)
        steps.append(y_t)
    torch.testing.assert_close(torch.stack(steps, 1), attn(x), atol=tol, rtol=0)


@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("gate", ["none", "input"])
def test_module_matches_float64_reference_with_gradients(name, gate):
    """The whole attention (auto impl, float32) against the same module's weights run through the
    quadratic reference in float64, gradients w.r.t. the input and every parameter."""
    torch.manual_seed(0)
    attn = make_attention("linear", 32, 4, feature_map=name, gate=gate)
    ref = make_attention("linear", 32, 4, feature_map=name, gate=gate).double()
    ref.load_state_dict(attn.state_dict())
    x = torch.randn(2, 45, 32, requires_grad=True)

    def by_reference(m, x):
        q, k, v = (m.split(t) for t in m.qkv(x).chunk(3, -1))
        fq, fk = m.feature_map(q), m.feature_map(k)
        log_g = None
        if gate != "none":
            a = m.gate_logits(x).transpose(1, 2)
            log_g, fk = torch.nn.functional.logsigmoid(a), fk * torch.sigmoid(-a)[..., None]
        return m.merge(quadratic(fq, fk, v, log_g))

    g = torch.randn(2, 45, 32)
    out = attn(x)
    got = torch.autograd.grad(out, [x, *attn.parameters()], g)
    xd = x.detach().double().requires_grad_()
    want_out = by_reference(ref, xd)
    want = torch.autograd.grad(want_out, [xd, *ref.parameters()], g.double())
    close((out, *got), (want_out, *want), 2e-4)


@pytest.mark.parametrize("options, one_call", [({"feature_map": "relu"}, True),
                                              ({"feature_map": "favor", "n_features": 16}, True),
                                              ({"feature_map": "rff"}, False),
                                              ({"feature_map": "favor", "n_features": 16, "gate": "head"}, False),
                                              ({"feature_map": "rff", "gate": "input"}, False)])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-9), (torch.float32, 1e-4)])
def test_whole_model_steps_equal_forward_for_other_maps(options, one_call, dtype, tol, cpu_kernel):
    """Ungated relu and favor decode in the one-call C++ step (the features by step_features, the fused
    kernel with phi the identity); rff and gated maps step layer by layer. Either equals the forward,
    and the one-call step equals the module loop on the same draws."""
    info = dataset_info("mnist")
    cfg = {"attention": "linear", "n_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "head": "categorical"}
    torch.manual_seed(0)
    model = build_model({**cfg, "attention_options": options}, info).to(dtype).eval()
    x = torch.randint(0, 256, (2, 30), dtype=torch.uint8)
    tokens = torch.cat([torch.full((2, 1), 256), x[:, :-1].long()], 1)
    runs = []
    for whole_model_kernel in (True, False):
        state = model.init_state(2, "cpu", whole_model_kernel=whole_model_kernel)
        assert (state.kernel is not None) == (one_call and whole_model_kernel)
        runs.append(torch.stack([model.step(tokens[:, t], state)[0] for t in range(30)], 1))
    with torch.no_grad():
        torch.testing.assert_close(runs[0], model(x), atol=tol, rtol=0)
    torch.testing.assert_close(runs[0], runs[1], atol=tol, rtol=0)


@pytest.mark.parametrize("feature_map", ["relu", "favor"])
def test_one_call_step_for_other_maps_in_int8_and_bfloat16(feature_map, cpu_kernel):
    """The one-call step of a relu or favor model at int8 (the C++ int8 product, forced for both) and
    bfloat16 products equals the module loop at the same precision (the same products; the loop's
    LayerNorm and residual adds are torch's, the step's fused), and stays near float32."""
    from imagegen.dtypes import INT8
    from imagegen.ops.int8 import forced_product
    from imagegen.precision import keep_out_of_int8
    cfg = {"attention": "linear", "n_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "head": "categorical",
           "attention_options": {"feature_map": feature_map, **({"n_features": 16} if feature_map == "favor" else {})}}
    torch.manual_seed(0)
    model = keep_out_of_int8(build_model(cfg, dataset_info("mnist")).eval())     # as a loaded model
    tokens = torch.cat([torch.full((3, 1), 256), torch.randint(0, 256, (3, 19))], 1)

    def steps(dtype, whole_model_kernel):
        with torch.no_grad(), forced_product("kernel"):
            state = model.init_state(3, "cpu", dtype, whole_model_kernel=whole_model_kernel)
            assert (state.kernel is not None) == whole_model_kernel
            return torch.stack([model.step(tokens[:, t], state)[0].float() for t in range(20)], 1)
    want = steps(torch.float32, False)
    for dtype, tol in ((INT8, 1e-4), (torch.bfloat16, 2e-2)):
        one_call, loop = steps(dtype, True), steps(dtype, False)
        torch.testing.assert_close(one_call, loop, atol=tol, rtol=0)
        assert (one_call - want).norm() < 0.05 * want.norm()


# ---------------------------------------------------------------- what the maps promise
@pytest.mark.parametrize("name", MAPS)
def test_features_positive_where_promised(name):
    torch.manual_seed(0)
    phi = make_feature_map(name, 2, 16, **({"n_features": 32} if FEATURE_MAPS[name].random else {}))
    x = torch.randn(3, 2, 50, 16) * 3
    f = phi(x)
    assert f.shape == (3, 2, 50, phi.n_out)
    if name == "relu":
        assert (f >= 0).all() and (f == 0).any()
    elif phi.positive:
        assert (f > 0).all(), name
    else:
        assert (f < 0).any(), "rff promises no positivity, and has negative features"


def test_favor_forward_is_its_definition():
    """Favor's forward (one addmm and an exp in place) equals `features(x E^-1/4)`, the estimator as
    written, in float64 with gradients, on a strided view as the model's projection gives."""
    torch.manual_seed(0)
    phi = make_feature_map("favor", 4, 8, n_features=24).double()
    x = torch.randn(2, 30, 3, 4, 8, dtype=torch.float64)[:, :, 1].transpose(1, 2).requires_grad_()  # (N, H, L, E)
    got, want = phi(x), phi.features(x * 8 ** -0.25)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    g = torch.randn_like(want)
    torch.testing.assert_close(*(torch.autograd.grad(y, x, g)[0] for y in (got, want)), rtol=1e-12, atol=1e-12)


def test_favor_draw_is_orthogonal_in_blocks_with_gaussian_norms():
    w = orthogonal_gaussian(20, 8, torch.Generator().manual_seed(0))          # blocks of 8, 8, 4 rows
    for block in (w[:8], w[8:16], w[16:]):
        unit = block / block.norm(dim=1, keepdim=True)
        torch.testing.assert_close(unit @ unit.T, torch.eye(len(block)), atol=1e-5, rtol=0)
    assert not torch.allclose(w.norm(dim=1), w.norm(dim=1)[0].expand(20))


def estimates(name, q, k, n_features, draws, seed=0):
    """phi(q) . phi(k) of `draws` independent draws of the map's `features` (the raw estimator)."""
    phi = make_feature_map(name, 1, q.shape[-1], n_features=n_features).double()
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(draws):
        phi.omega = phi.draw(gen).double()
        out.append((phi.features(q) * phi.features(k)).sum().item())
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("name", ["favor", "rff"])
def test_random_maps_estimate_the_softmax_kernel_without_bias(name):
    """Averaged over many draws, phi(q) . phi(k) -> exp(q . k) (fixed q, k), and the error of one
    draw falls as n_features grows (Performer's claim; variance ~ 1 / F)."""
    gen = torch.Generator().manual_seed(5)
    q, k = (torch.randn(8, generator=gen, dtype=torch.float64) * 0.4 for _ in range(2))
    truth = math.exp((q @ k).item())
    mean = estimates(name, q, k, 16, 4000).mean().item()
    assert abs(mean - truth) / truth < 0.02, f"{name}: mean of 4000 draws {mean:.4f} vs exp(q.k) = {truth:.4f}"
    mse = [((estimates(name, q, k, f, 400, seed=f) - truth) ** 2).mean().item() for f in (4, 16, 64)]
    assert mse[0] > mse[1] > mse[2], f"{name}: mean squared error at F = 4, 16, 64: {mse}"
    assert mse[2] < mse[0] / 6, f"{name}: 16x the features should cut the error far more: {mse}"


def test_favor_forward_estimates_scaled_dot_product_kernel():
    """The attention's favor map is the estimator on x / E^(1/4): phi(q) . phi(k) ~ exp(q . k / sqrt(E)),
    here 1.33, where exp(q . k) would be 2.34 times that. The mean over 32 seeded draws (one draw of 4,096
    features strays up to 40% at these norms, so a test on one draw of the global generator passed or
    failed with the tests run before it)."""
    E, gen = 16, torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 1, 1, E, generator=gen, dtype=torch.float64) * 0.8 for _ in range(2))
    phi = make_feature_map("favor", 1, E, n_features=4096).double()
    estimates = []
    for seed in range(32):
        phi.omega.copy_(phi.draw(torch.Generator().manual_seed(seed)))
        estimates.append((phi(q) * phi(k)).sum().item())
    assert abs(sum(estimates) / 32 / math.exp((q * k).sum().item() / math.sqrt(E)) - 1) < 0.15


# ---------------------------------------------------------------- the gate
def gated_inputs(N=2, H=3, L=45, Fd=6, M=4, seed=0, strong=False):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.rand(N, H, L, Fd, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(N, H, L, M, generator=gen, dtype=torch.float64)
    log_g = torch.nn.functional.logsigmoid(torch.randn(N, H, L, generator=gen, dtype=torch.float64) * 2
                                           + (0 if strong else 2))
    return q, k, v, log_g


def test_gate_one_is_the_ungated_attention():
    q, k, v, log_g = gated_inputs()
    zero = torch.zeros_like(log_g)
    plain = ops.causal_linear_attention(q, k, v, impl="reference")
    assert torch.equal(gated_reference(q, k, v, zero, ops.EPS), plain)              # bit for bit
    torch.testing.assert_close(gated_chunked(q, k, v, zero, ops.EPS, 16), plain, atol=1e-13, rtol=0)
    S1, S2 = torch.zeros(6, 6, 5, dtype=torch.float64), torch.zeros(6, 6, 5, dtype=torch.float64)
    for t in range(q.shape[2]):
        args = (q[:, :, t], k[:, :, t], v[:, :, t])
        assert torch.equal(gated_step(*args, torch.ones(2, 3, dtype=torch.float64), S1, ops.EPS),
                           gated_step(*args, None, S2, ops.EPS))


@pytest.mark.parametrize("chunk", [1, 7, 16, 64])
@pytest.mark.parametrize("strong", [False, True], ids=["mild", "strong-decay"])
def test_gated_chunked_equals_step_recurrence(chunk, strong):
    q, k, v, log_g = gated_inputs(strong=strong)
    S = torch.zeros(6, 6, 5, dtype=torch.float64)
    steps = torch.stack([gated_step(q[:, :, t], k[:, :, t], v[:, :, t], log_g[:, :, t].exp(), S, ops.EPS)
                         for t in range(q.shape[2])], 2)
    torch.testing.assert_close(gated_chunked(q, k, v, log_g, ops.EPS, chunk), steps, atol=1e-12, rtol=0)
    torch.testing.assert_close(quadratic(q, k, v, log_g), steps, atol=1e-12, rtol=0)


@pytest.mark.parametrize("impl", ["reference", "chunked", "auto"])
def test_gated_gradients_against_float64(impl):
    q, k, v, log_g = gated_inputs(L=70, strong=True)
    want = grads_of(quadratic, q, k, v, log_g)
    got = grads_of(lambda *t: ops.gated_linear_attention(*t, impl=impl), *(t.float() for t in (q, k, v, log_g)))
    close(got, want, 1e-4)


def test_gated_kernel_request_falls_back_with_one_warning():
    q, k, v, log_g = gated_inputs()
    kernel_mod._warned.discard(("the kernel form of the gated attention", "cpu"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = ops.gated_linear_attention(q, k, v, log_g, impl="kernel")
        ops.gated_linear_attention(q, k, v, log_g, impl="kernel")
    assert len([w for w in caught if "gated attention" in str(w.message)]) == 1
    torch.testing.assert_close(out, quadratic(q, k, v, log_g), atol=1e-12, rtol=0)


# ---------------------------------------------------------------- Triton, phi the identity
@pytest.mark.skipif(not (torch.cuda.is_available() or (ops.triton_error("cpu") is None)),
                    reason="Triton neither compiled (no GPU) nor interpreted (TRITON_INTERPRET unset)")
@pytest.mark.parametrize("name", ["relu", "favor", "rff"])
@pytest.mark.slow                            # Triton's interpreter
def test_triton_takes_mapped_features(name):
    device = "cuda" if torch.cuda.is_available() and not triton_linear.interpreting() else "cpu"
    torch.manual_seed(0)
    phi = make_feature_map(name, 2, 8, **({"n_features": 16} if FEATURE_MAPS[name].random else {})).double()
    q, k, v = raw(N=1, H=2, L=37, E=8, M=5)
    want = grads_of(lambda q, k, v: quadratic(phi(q), phi(k), v), q, k, v)
    phi32 = phi.float().to(device)
    got = grads_of(lambda q, k, v: ops.mapped_linear_attention(phi32(q), phi32(k), v, impl="triton").cpu(),
                   *(t.float().to(device) for t in (q, k, v)))
    close(got, want, 1e-4)
    fq, fk = (phi32(t.float().to(device)) for t in (q, k))
    state = torch.zeros(2, 16, 6, device=device)
    steps = torch.cat([triton_linear.triton_step(fq[:, :, t:t + 1], fk[:, :, t:t + 1],
                                                 v[:, :, t:t + 1].float().to(device),
                                                 state, ops.EPS, mapped=True) for t in range(37)], 2)
    close((steps.cpu(),), want[:1], 1e-4)


# ---------------------------------------------------------------- the draw: seeded, saved, redrawn
def tiny_cfg(options):
    return {"attention": "linear", "attention_options": options, "n_layers": 2, "d_model": 32, "n_heads": 4,
            "d_ff": 64, "head": "categorical", "n_mixtures": 5, "dropout": 0.0}


def save_tiny(path, options, seed=0):
    torch.manual_seed(seed)
    model = build_model(tiny_cfg(options), dataset_info("mnist"))
    data = {"name": "mnist", "root": str(path.parent), "download": False, "val_fraction": 0.05, "split_seed": 0}
    checkpoint.save(path, {"config": {"model": tiny_cfg(options), "data": data, "seed": seed},
                           "model": model.state_dict()})
    return model


def test_draw_comes_from_the_run_seed():
    def omega(seed):
        torch.manual_seed(seed)
        return build_model(tiny_cfg({"feature_map": "favor"}), dataset_info("mnist")).blocks[1].attn.feature_map.omega
    assert torch.equal(omega(0), omega(0)) and not torch.equal(omega(0), omega(1))


@pytest.mark.parametrize("options", [{"feature_map": "favor", "n_features": 24, "redraw_every": 3},
                                     {"feature_map": "rff", "gate": "input"}])
def test_checkpoint_keeps_the_draw(tmp_path, options):
    model = save_tiny(tmp_path / "a.pt", options)
    torch.manual_seed(123)                             # another global state at load: the draw must not come from it
    loaded = checkpoint.model_from_checkpoint(checkpoint.load(tmp_path / "a.pt"), tmp_path / "a.pt")
    for a, b in zip(model.blocks, loaded.blocks):
        assert torch.equal(a.attn.feature_map.omega, b.attn.feature_map.omega)
    x = torch.randint(0, 256, (2, 784), dtype=torch.uint8)
    assert torch.equal(model.eval()(x), loaded.eval()(x))


def test_redraw_every_n_training_forwards_and_the_draw_in_force_is_saved(tmp_path):
    model = save_tiny(tmp_path / "a.pt", {"feature_map": "favor", "n_features": 16, "redraw_every": 2})
    phi = model.blocks[0].attn.feature_map
    first = phi.omega.clone()
    x = torch.randint(0, 256, (1, 50), dtype=torch.uint8)
    model.train()
    model.nll(x)
    assert torch.equal(phi.omega, first)               # 1 call: no redraw yet
    model.nll(x)
    second = phi.omega.clone()
    assert not torch.equal(second, first) and phi.calls.item() == 2
    model.eval()
    with torch.no_grad():
        model.nll(x), model.nll(x)
    assert torch.equal(phi.omega, second)              # evaluation never redraws
    assert not torch.equal(model.blocks[1].attn.feature_map.omega, second)   # each layer its own draw
    checkpoint.save(tmp_path / "b.pt", {"config": checkpoint.load(tmp_path / "a.pt")["config"],
                                        "model": model.state_dict()})
    loaded = checkpoint.model_from_checkpoint(checkpoint.load(tmp_path / "b.pt"))
    assert torch.equal(loaded.blocks[0].attn.feature_map.omega, second)
    # the next draw is a function of the saved state alone: a resumed run draws what the first would have
    model.train(), loaded.train()
    for m in (model, loaded):
        m.nll(x), m.nll(x)
    assert torch.equal(model.blocks[0].attn.feature_map.omega, loaded.blocks[0].attn.feature_map.omega)


def test_elu_checkpoint_without_draw_still_loads(tmp_path):
    """An elu model's state_dict is what it was before feature maps existed: no new keys, and a
    checkpoint whose config names no feature map (every one so far) loads as elu."""
    save_tiny(tmp_path / "old.pt", {"impl": "auto"})
    ck = checkpoint.load(tmp_path / "old.pt")
    assert not any("feature_map" in k or "gate" in k for k in ck["model"])
    model = checkpoint.model_from_checkpoint(ck, tmp_path / "old.pt")
    assert all(b.attn.feature_map.name == "elu" and b.attn.plain_elu for b in model.blocks)


def test_bad_options_are_one_sentence():
    with pytest.raises(UserError, match="unknown feature_map 'cos'.*elu"):
        make_attention("linear", 32, 4, feature_map="cos")
    with pytest.raises(UserError, match="n_features=5 does not fit feature_map=rff.*multiple of 2"):
        make_attention("linear", 32, 4, feature_map="rff", n_features=5)
    with pytest.raises(UserError, match="feature_map=elu has no random features"):
        make_attention("linear", 32, 4, n_features=16)
    with pytest.raises(UserError, match="unknown gate 'yes'"):
        make_attention("linear", 32, 4, gate="yes")


def test_export_refuses_other_maps_in_one_sentence():
    from imagegen.web.site import page_config
    torch.manual_seed(0)
    for options in ({"feature_map": "favor"}, {"gate": "head"}):
        model = build_model(tiny_cfg(options), dataset_info("mnist"))
        with pytest.raises(UserError, match="browser sampler runs only elu \\+ 1 without a gate"):
            page_config(model, "mnist")
    page_config(build_model(tiny_cfg({}), dataset_info("mnist")), "mnist")


# ---------------------------------------------------------------- benchmarks name each map
def test_benchmarks_name_each_map():
    from imagegen.benchmarks.attention import attention_fn, n_features, parse_map
    from imagegen.benchmarks.compare import attention_label
    assert parse_map("favor:128+gate") == {"feature_map": "favor", "n_features": 128, "gate": "input"}
    assert n_features("rff", 32) == 64 and n_features("elu", 32) == 32 and n_features("favor:16", 32) == 16
    with pytest.raises(UserError, match="bad feature_maps entry 'cos:x'"):
        parse_map("cos:x")
    q, k, v = (t.float() for t in raw(N=1, H=2, L=20, E=8, M=8))
    for spec in ("elu", "relu", "favor:16", "rff:16", "elu+gate"):
        assert attention_fn("chunked", spec, 2, 8)(q, k, v).shape == (1, 2, 20, 8)
    cfg = {"attention": "linear", "attention_options": {"feature_map": "favor", "n_features": 64, "gate": "input"}}
    assert attention_label(cfg) == "linear favor:64 gate=input"
    assert attention_label({"attention": "linear", "attention_options": {"impl": "auto"}}) == "linear elu"
    assert attention_label({"attention": "softmax"}) == "softmax"
