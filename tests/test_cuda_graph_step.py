"""The sampler's step function (imagegen/sampling/cuda_graph_step.py): the CUDA-graph form's logic (static
buffers, the position as a tensor, in-place state, reset) run eagerly on the CPU against the
per-module loop `PixelTransformer.step`; when it is used, and that the plan (sampling/plan.py), not the
model, keeps it; and, with a GPU, compiled against eager."""
import functools

import pytest
import torch

from imagegen.sampling import plan
from imagegen.sampling.cuda_graph_step import GraphedStep
from imagegen.sampling.plan import make_step, use_graphs
from imagegen.attention.linear import LinearState
from fixtures import tiny_model


def linear_model(impl="chunked", attention="linear", device="cpu", context=()):
    options = {"impl": impl} if attention == "linear" else {}
    return tiny_model(attention, length=24, channels=3, width=2, n_layers=2, head="mixture",
                      attention_options=options, context=context).to(device).eval()


def loop_outputs(model, tokens, step):
    return torch.stack([step(tokens[:, t]) for t in range(tokens.shape[1])], 1)


@torch.no_grad()
@pytest.mark.parametrize("context", [(), (2, 3, 6)])
def test_static_buffer_step_equals_the_per_module_loop(context):
    model = linear_model(context=context)
    tokens = torch.randint(0, 257, (3, 24))
    state = model.init_state(3, "cpu")
    want = loop_outputs(model, tokens, lambda tok: model.step(tok, state)[0])
    graphed = GraphedStep(model, 3, "cpu", torch.float32, compile=False)
    torch.testing.assert_close(loop_outputs(model, tokens, graphed), want, rtol=1e-5, atol=1e-6)
    assert int(graphed.t) == 24
    torch.testing.assert_close(loop_outputs(model, tokens, graphed.reset()), want, rtol=1e-5, atol=1e-6)


def test_used_on_cuda_for_linear_models_only():
    model, cuda = linear_model(), torch.device("cuda")
    assert use_graphs(model, cuda)
    assert not use_graphs(model, torch.device("cpu"))
    assert not use_graphs(linear_model(attention="softmax"), cuda)
    step = make_step(model, 2, "cpu", torch.float32)
    assert not isinstance(step, GraphedStep)                      # the CPU runs the per-module loop


def test_the_plan_keeps_the_graphed_steps_and_the_model_nothing(monkeypatch):
    """Graphs compile once per (batch, device, dtype) and are replayed after a reset; a new model replaces
    them; the model's attributes are what they were (eager GraphedSteps stand in for the compiled ones)."""
    monkeypatch.setattr(plan, "use_graphs", lambda model, device: True)
    monkeypatch.setattr(plan, "GraphedStep", functools.partial(GraphedStep, compile=False))
    monkeypatch.setattr(plan, "GRAPHED", plan.GraphedSteps())
    model = linear_model()
    before = set(vars(model))
    first = make_step(model, 2, "cpu", torch.float32)
    first(torch.zeros(2, dtype=torch.long))
    again = make_step(model, 2, "cpu", torch.float32)
    assert isinstance(first, GraphedStep) and again is first and int(again.t) == 0
    assert make_step(model, 3, "cpu", torch.float32) is not first
    assert set(vars(model)) == before
    other = linear_model()
    assert make_step(other, 2, "cpu", torch.float32) is not first and plan.GRAPHED.model is other


def test_refuses_the_fused_cpu_state(monkeypatch):
    model = linear_model()
    fused = LinearState(qkv=None, out=None, S=torch.zeros(1), form="fused")
    monkeypatch.setattr(model.blocks[0].attn, "init_state", lambda *a: fused)
    with pytest.raises(ValueError, match="PyTorch form"):
        GraphedStep(model, 2, "cpu", torch.float32, compile=False)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@torch.no_grad()
def test_cuda_graph_step_equals_eager():
    model = linear_model(impl="auto", device="cuda")
    tokens = torch.randint(0, 257, (4, 24), device="cuda")
    want = loop_outputs(model, tokens, GraphedStep(model, 4, "cuda", torch.float32, compile=False))
    step = make_step(model, 4, "cuda", torch.float32)
    assert isinstance(step, GraphedStep)
    for _ in range(2):                                            # a second pass replays after reset
        torch.testing.assert_close(loop_outputs(model, tokens, step), want, rtol=1e-4, atol=1e-5)
        step = make_step(model, 4, "cuda", torch.float32)
