import pytest
import torch

from imagegen.store import checkpoint, checks
from imagegen.errors import UserError
from imagegen.model.transformer import PixelTransformer
from fixtures import skip_without_cpu_kernel, tiny_model


@pytest.mark.parametrize("attention", ["linear", "softmax"])
@pytest.mark.parametrize("channels", [1, 3])
def test_model_step_matches_forward(attention, channels):
    torch.manual_seed(0)
    model = PixelTransformer(12 * channels, channels, 4, attention, n_layers=2, d_model=32, n_heads=4, d_ff=64,
                             head="mixture").eval()
    x = torch.randint(0, 256, (2, 12 * channels), dtype=torch.uint8)
    state = model.init_state(2, "cpu")
    token, steps = torch.full((2,), 256), []
    for t in range(x.shape[1]):
        params, state = model.step(token, state)
        steps.append(params)
        token = x[:, t].long()
    assert torch.allclose(torch.stack(steps, 1), model(x), atol=1e-4)


def test_relu2_model_steps_as_its_forward_in_the_module_loop_and_is_checked():
    """model.activation=relu2: the feed-forward is relu(x)^2 in the forward and the step alike (float64), the
    step runs the module loop (the one-call C++ step computes GELU), and the browser page and a bad name are
    refused in one sentence."""
    from imagegen.config import ACTIVATIONS
    from imagegen.config.checks import check_model
    from imagegen.config.schema import ModelConfig
    from imagegen.model.transformer import ACTIVATION
    from imagegen.web.site import page_config
    from dataclasses import asdict
    assert set(ACTIVATION) == set(ACTIVATIONS)          # the names the config accepts are the ones the model builds
    torch.manual_seed(0)
    model = PixelTransformer(12, 1, 4, "linear", n_layers=2, d_model=32, n_heads=4, d_ff=64, head="categorical",
                             activation="relu2").double().eval()
    h = torch.randn(3, 32, dtype=torch.float64)
    assert torch.equal(model.blocks[0].ff[1](h), torch.relu(h) ** 2)
    x = torch.randint(0, 256, (2, 12), dtype=torch.uint8)
    state = model.init_state(2, "cpu")
    assert state.kernel is None
    token, steps = torch.full((2,), 256), []
    with torch.no_grad():
        for t in range(12):
            steps.append(model.step(token, state)[0])
            token = x[:, t].long()
        torch.testing.assert_close(torch.stack(steps, 1), model(x), rtol=1e-10, atol=1e-10)
    with pytest.raises(UserError, match="runs gelu only"):
        page_config(model, "mnist")
    with pytest.raises(UserError, match="model.activation must be one of gelu, relu2, got 'swish'"):
        check_model({**asdict(ModelConfig()), "activation": "swish"})


@pytest.mark.parametrize("attention", ["linear", "softmax"])
@pytest.mark.parametrize("kernel", [True, False], ids=["one-call", "module-loop"])
def test_context_model_step_matches_forward_and_reads_its_neighbours(attention, kernel):
    """model.context: each step adds the embeddings of the bytes 2, 3 and 12 positions back (START
    before the image), as the forward does (float64); changing one byte changes exactly the positions
    that read it."""
    torch.manual_seed(0)
    model = PixelTransformer(48, 3, 4, attention, n_layers=2, d_model=32, n_heads=4, d_ff=64, head="mixture",
                             num_classes=3, context=(2, 3, 12)).double().eval()
    for emb in model.ctx:
        torch.nn.init.normal_(emb.weight, std=0.5)
    x, labels = torch.randint(0, 256, (2, 48), dtype=torch.uint8), torch.tensor([0, 2])
    state = model.init_state(2, "cpu", labels=labels, whole_model_kernel=kernel)
    token, steps = torch.full((2,), 256), []
    with torch.no_grad():
        for t in range(48):
            steps.append(model.step(token, state)[0])
            token = x[:, t].long()
        want = model(x, labels)
        torch.testing.assert_close(torch.stack(steps, 1), want, rtol=1e-10, atol=1e-10)
        if attention == "linear":
            y = x.clone()
            y[:, 20] = (y[:, 20].long() + 7).to(torch.uint8)
            changed = (model(y, labels) - want).abs().amax((0, 2)) > 0
            assert changed[:21].tolist() == [False] * 21 and changed[21:].all()  # 21 reads it as the input
            model.blocks = model.blocks[:0]          # no attention: only the input byte and the context
            changed = (model(y, labels) - model(x, labels)).abs().amax((0, 2)) > 0
            assert changed.nonzero().flatten().tolist() == [21, 22, 23, 32]


def test_context_is_checked_and_grows_from_a_model_with_fewer_distances(tmp_path):
    """A bad model.context is one sentence; train.init from a model without context, or with fewer
    distances, starts each new embedding at zero and keeps each old one with its distance, so the
    first step computes what the checkpoint did."""
    from imagegen.config.checks import check_model
    from imagegen.config.schema import ModelConfig
    from dataclasses import asdict
    for bad in ([1], [2, 2], [0, 3]):
        with pytest.raises(UserError, match="context must list distinct sub-pixel distances >= 2"):
            check_model({**asdict(ModelConfig()), "context": bad})
    plain = tiny_model("linear", length=784, channels=1, width=28)
    cfg = {"model": {**asdict(ModelConfig()), "n_layers": 1, "d_model": 16, "n_heads": 2, "d_ff": 32},
           "data": {"name": "mnist"}}
    path = tmp_path / "plain.pt"
    torch.save({"format": checkpoint.FORMAT, "config": cfg, "model": plain.state_dict()}, path)
    grown = {**cfg, "model": {**cfg["model"], "context": [2, 4]}}
    weights = checkpoint.initial_weights(str(path), grown)
    model = tiny_model("linear", length=784, channels=1, width=28, context=(2, 4))
    model.load_state_dict(weights)
    assert all(not emb.weight.any() for emb in model.ctx)
    x = torch.randint(0, 256, (2, 784), dtype=torch.uint8)
    torch.testing.assert_close(model(x), plain(x))
    for emb in model.ctx:
        torch.nn.init.normal_(emb.weight)
    torch.save({"format": checkpoint.FORMAT, "config": grown, "model": model.state_dict()}, tmp_path / "grown.pt")
    more = {**cfg, "model": {**cfg["model"], "context": [4, 3, 2]}}      # another order, one new distance
    wider = tiny_model("linear", length=784, channels=1, width=28, context=(4, 3, 2))
    wider.load_state_dict(checkpoint.initial_weights(str(tmp_path / "grown.pt"), more))
    assert not wider.ctx[1].weight.any() and wider.ctx[0].weight.equal(model.ctx[1].weight)
    torch.testing.assert_close(wider(x), model(x))
    for fewer in (cfg, {**cfg, "model": {**cfg["model"], "context": [2, 3]}}):  # another architecture
        with pytest.raises(UserError, match="model.context"):
            checkpoint.initial_weights(str(tmp_path / "grown.pt"), fewer)


@pytest.mark.parametrize("attention", ["linear", "softmax", "lsh"])
def test_bf16_autocast_loss_and_gradients_track_float32(attention):
    """Training under bfloat16 autocast (train.bf16) scores within 1% of float32, with a float32
    loss and gradients pointing the same way."""
    torch.manual_seed(0)
    options = {"chunk_size": 4} if attention == "lsh" else {}
    model = PixelTransformer(32, 1, 8, attention, n_layers=2, d_model=32, n_heads=4, d_ff=64, head="mixture",
                             attention_options=options).eval()
    x = torch.randint(0, 256, (4, 32), dtype=torch.uint8)

    def loss_and_grad(bf16):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model.nll(x).mean()
        loss.backward()
        return loss, torch.cat([p.grad.flatten() for p in model.parameters()])

    (loss32, grad32), (loss16, grad16) = loss_and_grad(False), loss_and_grad(True)
    assert loss16.dtype == torch.float32
    assert abs(loss16.item() - loss32.item()) < 0.01 * loss32.item()
    assert torch.nn.functional.cosine_similarity(grad16, grad32, dim=0) > 0.99


@pytest.mark.parametrize("dtype, tol, d_model", [(torch.float64, 1e-12, 32), (torch.float32, 1e-5, 32),
                                                  (torch.float32, 1e-5, 40)])
def test_whole_model_kernel_step_matches_the_module_loop(dtype, tol, d_model):
    """The one-call C++ decoding step of a linear model against the per-module loop (torch's add and
    LayerNorm; float32: the step's own fused add and LayerNorm, d_model 40 leaving a tail of 8 values
    past the vectors)."""
    torch.manual_seed(0)
    model = PixelTransformer(24, 3, 4, "linear", n_layers=3, d_model=d_model, n_heads=4, d_ff=64,
                             head="mixture").to(dtype).eval()
    fast = model.init_state(2, "cpu", dtype)
    if fast.kernel is None:
        skip_without_cpu_kernel("the fused CPU kernel is unavailable")
    slow = model.init_state(2, "cpu", dtype, whole_model_kernel=False)
    x = torch.randint(0, 256, (2, 24))
    token = torch.full((2,), 256)
    with torch.inference_mode():
        for t in range(24):
            torch.testing.assert_close(model.step(token, fast)[0], model.step(token, slow)[0], rtol=tol, atol=tol)
            token = x[:, t]


def test_every_subpixel_is_scored_including_the_first():
    model = tiny_model("linear", head="mixture")
    x = torch.randint(0, 256, (1, 16), dtype=torch.uint8)
    nll = model.nll(x)
    assert nll.shape == (1, 16)
    x2 = x.clone()
    x2[0, 0] = (int(x[0, 0]) + 100) % 256
    assert nll[0, 0] != model.nll(x2)[0, 0]           # x_0 is predicted (from the start token) and scored


def tiny_cfg(attention="linear", d_model=16):
    model = {"attention": attention, "attention_options": {}, "n_layers": 1, "d_model": d_model, "n_heads": 2,
             "d_ff": 32, "head": "mixture", "n_mixtures": 2, "dropout": 0.0}
    return {"model": model, "data": {"name": "mnist"}}


def test_checkpoint_round_trip_and_bad_files(tmp_path):
    cfg = tiny_cfg()
    model = PixelTransformer(784, 1, 28, **{k: v for k, v in cfg["model"].items()})
    path = tmp_path / "a.pt"
    checkpoint.save(path, {"config": cfg, "model": model.state_dict()})
    assert not (tmp_path / "a.pt.tmp").exists()
    ck = checkpoint.load(path)
    restored = checkpoint.model_from_checkpoint(ck, path)
    x = torch.randint(0, 256, (1, 784), dtype=torch.uint8)
    assert torch.equal(restored(x), model(x))

    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(UserError, match="not a readable checkpoint"):
        checkpoint.load(truncated)
    junk = tmp_path / "junk.pt"
    junk.write_text("hello")
    with pytest.raises(UserError, match="not a readable checkpoint"):
        checkpoint.load(junk)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(UserError, match="not an imagegen checkpoint"):
        checkpoint.load(foreign)
    with pytest.raises(UserError, match="does not exist"):
        checkpoint.load(tmp_path / "missing.pt")

    ck["model"]["proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(UserError, match="do not fit the architecture"):
        checkpoint.model_from_checkpoint(ck, path)
    with pytest.raises(UserError, match="different architecture.*d_model"):
        checks.check_compatible(checkpoint.load(path), tiny_cfg(d_model=32), path)
    other_impl = tiny_cfg()                  # the implementation is not the architecture: a run may switch it
    other_impl["model"]["attention_options"] = {"impl": "chunked"}
    other_impl["train"] = {"optimizer": "adamw"}
    assert checks.check_compatible(checkpoint.load(path), other_impl, path) == [
        "model.attention_options.impl: 'auto' -> 'chunked'"]
