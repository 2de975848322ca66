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


@pytest.mark.parametrize("channels", [1, 3])
def test_name_rows_writes_each_name_left_of_its_row(channels):
    """A margin on the left, background-coloured except where a row's name is written (dark ink near
    the row's middle), the grid itself unchanged beside it."""
    from imagegen.sampling.decode import grid, name_rows
    tiles = np.full((4, 10, 10, channels), 128, np.uint8)
    picture = grid(tiles, nrow=2, scale=2)
    named = np.asarray(name_rows(picture.copy(), ["cat", "airplane"]))
    margin = named.shape[1] - picture.width
    assert margin > 0 and named.shape[0] == picture.height
    assert np.array_equal(named[:, margin:], np.asarray(picture))
    left = named[:, :margin].reshape(picture.height, margin, -1).min(-1)
    assert set(np.unique(left)) - {255} and left.max() == 255       # ink and white, never another colour
    if channels == 3:
        assert (named[:, :margin] == named[:, :margin, :1]).all()     # grey ink on white, not red
    inked = np.nonzero((left < 128).any(1))[0]
    assert inked.min() < picture.height / 2 < inked.max()            # both rows named
