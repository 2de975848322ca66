"""Class-conditional models: the class embedding, label dropout's "no label" row, classifier-free
guidance in both sampling loops, and step == forward with labels."""
import math

import pytest
import torch

from imagegen.errors import UserError
from imagegen.model.heads import GUIDANCE_BOUND, Categorical, LogisticMixture, guided_probs
from imagegen.model.transformer import START, PixelTransformer
from imagegen.sampling.decode import generate


def tiny(attention="linear", classes=3, length=48, channels=3, **kw):
    torch.manual_seed(0)
    model = PixelTransformer(length, channels, 4, attention, n_layers=2, d_model=32, n_heads=4, d_ff=64,
                             num_classes=classes, **{"head": "mixture", **kw}).double()
    if classes:
        torch.nn.init.normal_(model.label.weight, std=1.0)       # a trained model's classes differ this much
    return model


def test_the_class_changes_the_prediction_from_the_first_sub_pixel():
    model = tiny()
    x = torch.randint(0, 256, (1, 48), dtype=torch.uint8).repeat(3, 1)
    out = model(x, torch.tensor([0, 1, 2]))
    for a, b in ((0, 1), (1, 2), (0, 2)):
        assert not torch.allclose(out[a, 0], out[b, 0])


def test_no_label_is_the_last_row_and_what_label_dropout_trains():
    model = tiny()
    x = torch.randint(0, 256, (2, 48), dtype=torch.uint8)
    none = model(x)
    assert torch.equal(none, model(x, torch.tensor([-1, -1])))
    assert torch.equal(none, model(x, torch.tensor([3, 3])))     # row C: the dropped label
    assert not torch.allclose(none, model(x, torch.tensor([0, 0])))


def test_unconditional_models_have_no_label_parameters_and_refuse_labels_when_sampling():
    model = tiny(classes=0)
    assert not any("label" in name for name in model.state_dict())
    with pytest.raises(UserError, match="unconditional"):
        generate(model, 2, labels=[0, 1])


@pytest.mark.parametrize("labels", [[0, 5], [0, 1, 2], [0, -2]])
def test_bad_labels_are_one_sentence(labels):
    with pytest.raises(UserError, match="labels must be"):
        generate(tiny(), 2, labels=labels)


@pytest.mark.parametrize("attention,whole_model", [("linear", True), ("linear", False), ("softmax", False)])
def test_step_equals_forward_with_labels(attention, whole_model):
    model = tiny(attention).float().eval()
    x = torch.randint(0, 256, (3, 48), dtype=torch.uint8)
    y = torch.tensor([2, -1, 0])
    with torch.no_grad():
        expected = model(x, y)
        state = model.init_state(3, "cpu", whole_model_kernel=whole_model, labels=y)
        token = torch.full((3,), START)
        for t in range(48):
            params, state = model.step(token, state)
            torch.testing.assert_close(params, expected[:, t], rtol=1e-4, atol=1e-4)
            token = x[:, t].long()


@pytest.mark.parametrize("head", [Categorical(), LogisticMixture(3)])
def test_guidance_combines_the_two_distributions(head):
    torch.manual_seed(1)
    pc, pu = torch.randn(4, head.n_params), torch.randn(4, head.n_params)
    c, u = head.probs(pc), head.probs(pu)
    assert torch.equal(guided_probs(head, pc, pu, 1.0), c)
    torch.testing.assert_close(guided_probs(head, pc, pu, 0.0), u / u.sum(-1, keepdim=True))
    half = c ** 0.5 * u ** 0.5
    torch.testing.assert_close(guided_probs(head, pc, pu, 0.5), half / half.sum(-1, keepdim=True))
    g = guided_probs(head, pc, pu, 3.0)                 # above 1: the log-ratio bounded by GUIDANCE_BOUND
    expected = c * torch.exp(2 * torch.log(c / u).clamp(-GUIDANCE_BOUND, GUIDANCE_BOUND))
    torch.testing.assert_close(g, expected / expected.sum(-1, keepdim=True))


def test_guidance_above_one_cannot_lift_a_value_the_class_finds_unlikely():
    """Unbounded p_c^G p_u^(1-G) lifts a value with p_c = 1e-3 and p_u = 1e-6 above one both find
    likely; the bounded form keeps every value within e^((G-1)B) of p_c, whatever G."""
    head = Categorical()
    rest = [1e-3 / 253] * 253
    c = torch.tensor([[0.5, 0.498, 1e-3] + rest], dtype=torch.float64)
    u = torch.tensor([[0.5, 0.499 - 1e-6, 1e-6] + rest], dtype=torch.float64)
    unbounded = c ** 5 * u ** -4
    assert (unbounded / unbounded.sum())[0, 2] > 0.99
    for G in (2.0, 5.0, 50.0):
        g = guided_probs(head, c.log(), u.log(), G)
        boost = g / c
        assert boost.max() / boost[0, :3].min() <= math.exp(2 * (G - 1) * GUIDANCE_BOUND) * (1 + 1e-5)
        assert g[0, 2] < 0.01 * g[0, 0] * math.exp(2 * (G - 1) * GUIDANCE_BOUND)


@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_guided_rnn_sampler_equals_guided_recompute_sampler(attention):
    model = tiny(attention, head="categorical")
    labels = torch.tensor([0, 1, 2, 1, -1])
    stepped = generate(model, 5, sampler="step", seed=3, batch_size=2, labels=labels, guidance=2.5)
    recomputed = generate(model, 5, sampler="recompute", seed=3, batch_size=2, labels=labels, guidance=2.5)
    assert torch.equal(stepped, recomputed)
    plain = generate(model, 5, sampler="step", seed=3, batch_size=2, labels=labels)
    assert not torch.equal(stepped, plain)


def test_guidance_one_is_the_conditional_distribution_and_needs_no_second_branch(monkeypatch):
    model = tiny(head="categorical")
    labels = torch.tensor([1, 2])
    batches = []
    original = model.init_state
    monkeypatch.setattr(model, "init_state", lambda batch, *a, **k: batches.append(batch) or original(batch, *a, **k))
    generate(model, 2, labels=labels, guidance=1.0)
    generate(model, 2, labels=labels, guidance=2.0)
    assert batches == [2, 4]


def test_a_single_label_applies_to_every_image():
    model = tiny(head="categorical")
    assert torch.equal(generate(model, 3, labels=[2], seed=5), generate(model, 3, labels=[2, 2, 2], seed=5))


@pytest.mark.slow
def test_conditional_training_keeps_an_average_of_the_weights_and_samples_by_time(tmp_path, mnist_root):
    """Through the trainer: labels reach the model, validation reports the averaged and the raw
    weights, best.pt holds both, and train.sample_minutes writes grids without sample_every."""
    import json

    from omegaconf import OmegaConf

    from imagegen.store import checkpoint
    from imagegen import config
    from imagegen.commands.cli import compose
    from imagegen.training.trainer import train

    config.register()
    run_dir = tmp_path / "run"
    cfg = OmegaConf.to_container(compose("train", [
        f"data.root={mnist_root}", f"run_dir={run_dir}", "model.n_layers=1", "model.d_model=16", "model.n_heads=2",
        "model.d_ff=32", "model.num_classes=10", "train.ema=0.9", "train.max_steps=4", "train.val_every=2",
        "train.val_images=4", "train.batch_size=4", "train.sample_every=0", "train.sample_minutes=1e-9",
        "train.sample_images=4", "train.progress=false", "train.tensorboard=false", "train.warmup_steps=1"]),
        resolve=True)
    train(cfg, torch.device("cpu"))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if "val_bpd" in r]
    assert [r["step"] for r in val] == [2, 4] and all(r["val_bpd"] != r["val_bpd_raw"] for r in val)
    best = checkpoint.load(run_dir / "best.pt")
    assert best["ema"].keys() == best["model"].keys() and "label.weight" in best["ema"]
    assert not torch.equal(best["ema"]["label.weight"], best["model"]["label.weight"])
    assert sorted(p.name for p in (run_dir / "samples").glob("*.png")) == [f"step_00000{i}.png" for i in (1, 2, 3, 4)]
    loaded = checkpoint.model_from_checkpoint(best)                     # sampling and eval take the average
    assert torch.equal(loaded.label.weight, best["ema"]["label.weight"])


def test_num_classes_must_match_the_data(tmp_path, mnist_root):
    from omegaconf import OmegaConf

    from imagegen import config
    from imagegen.commands.cli import compose
    from imagegen.training.trainer import train

    config.register()
    overrides = [f"data.root={mnist_root}", f"run_dir={tmp_path}", "model.num_classes=7"]
    cfg = OmegaConf.to_container(compose("train", overrides), resolve=True)
    with pytest.raises(UserError, match="mnist has 10 classes; set model.num_classes=10"):
        train(cfg, torch.device("cpu"))
