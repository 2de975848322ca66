import pytest
import torch

from imagegen.attention import make_attention
from imagegen.attention.lsh import LSHAttention
from imagegen.attention.lsh_naive import lsh_reference
from imagegen.ops import kernel_error

ALL = {"softmax": {}, "linear": {}, "lsh": {"n_hashes": 2, "n_buckets": 4, "chunk_size": 8}}


@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("L", [37, 64])
def test_output_at_t_ignores_later_inputs(name, L):
    torch.manual_seed(0)
    attn = make_attention(name, 32, 4, **ALL[name]).double().eval()
    x = torch.randn(2, L, 32, dtype=torch.float64)
    y = attn(x)
    for t in (0, 5, L // 2, L - 2):
        x2 = x.clone()
        x2[:, t + 1:] = torch.randn_like(x2[:, t + 1:])
        assert torch.allclose(attn(x2)[:, :t + 1], y[:, :t + 1], atol=1e-12, rtol=0), f"{name} leaks at t={t}"
        assert not torch.allclose(attn(x2)[:, t + 1:], y[:, t + 1:])   # and later outputs do depend on them


@pytest.mark.parametrize("name, options", [("softmax", {}), ("linear", {}), ("linear", {"impl": "chunked"})],
                         ids=["softmax", "linear-auto", "linear-chunked"])  # auto: the fused kernel's step
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float64, 1e-10)])
def test_step_matches_forward(name, options, dtype, tol):
    torch.manual_seed(0)
    attn = make_attention(name, 32, 4, **options).to(dtype)
    x = torch.randn(3, 41, 32, dtype=dtype)
    state = attn.init_state(3, 41, "cpu", dtype)
    if name == "linear":
        assert (state.form == "fused") == (options.get("impl") != "chunked" and kernel_error("cpu") is None)
    steps = []
    for t in range(41):
        y_t, state = attn.step(x[:, t], state)
        steps.append(y_t)
    assert torch.allclose(torch.stack(steps, 1), attn(x), atol=tol, rtol=0)


@pytest.mark.parametrize("L,chunk", [(30, 8), (33, 4), (16, 16)])
def test_lsh_matches_loop_reference(L, chunk):
    torch.manual_seed(1)
    attn = LSHAttention(16, 2, n_hashes=3, n_buckets=4, chunk_size=chunk).double().eval()
    x = torch.randn(2, L, 16, dtype=torch.float64)
    assert torch.allclose(attn(x), lsh_reference(attn, x), atol=1e-10)


def test_lsh_eval_is_reproducible_and_train_is_random():
    torch.manual_seed(0)
    attn = LSHAttention(32, 4, n_buckets=8, chunk_size=4).eval()
    x = torch.randn(2, 50, 32)
    y = attn(x)
    assert torch.equal(attn(x), y)
    attn.eval_seed = 1
    assert not torch.equal(attn(x), y)
    attn.train()
    assert not torch.equal(attn(x), attn(x))


def test_lsh_cannot_step():
    attn = LSHAttention(32, 4)
    assert not attn.can_step
    with pytest.raises(NotImplementedError, match="recompute"):
        attn.init_state(1, 10, "cpu", torch.float32)


@pytest.mark.parametrize("name, options", [("linear", {}), ("linear", {"impl": "auto"}), ("softmax", {}),
                                           ("lsh", {"n_hashes": 4, "n_buckets": 64, "chunk_size": 32}),
                                           ("linear", {"impl": "chunked", "feature_map": "favor", "n_features": 8,
                                                       "redraw_every": 0, "gate": "none"})])
def test_checkpoint_options_build(name, options):
    """A checkpoint's attention_options, a plain dict: empty or partial (older runs) or whole (newer ones);
    the missing ones take the defaults of the attention's Options, and all compare equal to the whole."""
    from imagegen import config
    from imagegen.store.checks import architecture_diffs
    attn = make_attention(name, 16, 2, **options)
    whole = {f: getattr(attn.parse_options(options), f) for f in config.ATTENTION_OPTIONS[name].__dataclass_fields__}
    assert whole == config.full_attention_options(name, options)
    model = {"attention": name, "n_layers": 1}
    assert architecture_diffs({**model, "attention_options": options}, {**model, "attention_options": whole}) == []
    if name == "lsh":
        assert (attn.n_hashes, attn.n_buckets, attn.chunk_size, attn.eval_seed) == (4, 64, 32, 0)


def test_each_attention_holds_its_options_dataclass():
    from imagegen import config
    from imagegen.attention import ATTENTIONS
    assert {name: cls.Options for name, cls in ATTENTIONS.items()} == config.ATTENTION_OPTIONS


@pytest.mark.parametrize("name, options, pattern", [
    ("linear", {"bogus": 1}, "the linear attention has no option 'bogus' (model.attention_options.bogus); its "
                             "options are impl, feature_map, n_features, redraw_every, gate"),
    ("lsh", {"impl": "auto"}, "the lsh attention has no option 'impl'"),
    ("softmax", {"impl": "auto"}, "it takes none"),
    ("lsh", {"n_hashes": "4"}, "model.attention_options.n_hashes of the lsh attention must be int, got '4'."),
    ("linear", {"n_features": 8.5}, "must be Optional[int], got 8.5."),
])
def test_bad_options_are_one_sentence(name, options, pattern):
    from imagegen.errors import UserError
    with pytest.raises(UserError) as e:
        make_attention(name, 16, 2, **options)
    assert pattern in str(e.value) and "\n" not in str(e.value)
