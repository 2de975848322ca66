import numpy as np
import pytest
import torch

from imagegen.errors import UserError
from imagegen.model.transformer import PixelTransformer
from imagegen.sampling.decode import completion_rows, generate, grid


def tiny(attention, length=48, channels=3, **kw):
    torch.manual_seed(0)
    kw.setdefault("head", "mixture")
    return PixelTransformer(length, channels, 4, attention, n_layers=2, d_model=32, n_heads=4, d_ff=64, **kw).double()


@pytest.mark.parametrize("attention,head", [("linear", "mixture"), ("softmax", "mixture"), ("linear", "categorical")])
def test_step_sampling_equals_recompute_sampling(attention, head):
    model = tiny(attention, head=head)
    stepped = generate(model, 5, sampler="step", seed=3, batch_size=2)
    recomputed = generate(model, 5, sampler="recompute", seed=3, batch_size=2)
    assert torch.equal(stepped, recomputed)
    assert not torch.equal(stepped, generate(model, 5, sampler="step", seed=4, batch_size=2))


def test_lsh_samples_by_recompute_only():
    model = tiny("lsh", attention_options={"n_buckets": 4, "chunk_size": 4})
    assert generate(model, 2, seed=0).shape == (2, 48)
    with pytest.raises(UserError, match="cannot step"):
        generate(model, 2, sampler="step")


@pytest.mark.parametrize("sampler", ["step", "recompute"])
def test_completion_keeps_the_prefix(sampler):
    model = tiny("linear", length=64, channels=1)
    prefix = torch.randint(0, 256, (3, 32), dtype=torch.uint8)
    out = generate(model, 3, sampler=sampler, prefix=prefix, seed=1)
    assert torch.equal(out[:, :32], prefix)


def test_grid_layout_and_completion_rows():
    images = np.random.default_rng(0).integers(0, 256, (10, 4, 4, 1), dtype=np.uint8)
    pic = grid(images, nrow=4, scale=3, pad=1)
    assert pic.size == ((4 * 5 + 1) * 3, (3 * 5 + 1) * 3) and pic.mode == "L"
    rows = completion_rows(images[:2], images[2:8].reshape(2, 3, 4, 4, 1), keep=2)
    assert rows.shape == (10, 4, 4, 1)
    assert (rows[0, 2:] == 128).all() and np.array_equal(rows[0, :2], images[0, :2])
    assert np.array_equal(rows[4], images[0])
