"""The colour model that ships in checkpoints/: it loads by name with its context, its files are small,
and it still scores what its card and its record say on the first 500 real test images, in float32
and with 8-bit products."""
import json
import re

import pytest
import torch

import imagegen
from fixtures import assert_shipped_files_small, shared_data
from imagegen.bits_per_dim import bits_per_dim
from imagegen.data.splits import load_split
from imagegen.store import checkpoint, shipped

NAME = "cifar10-linear"


def test_the_shipped_files_are_there_and_small():
    assert_shipped_files_small(NAME, 16)


def test_it_loads_by_name_with_its_context():
    ck = checkpoint.load(NAME)
    model = checkpoint.model_from_checkpoint(ck, NAME)
    assert model.num_classes == 10 and model.channels == 3
    assert model.context == (2, 3, 4, 5, 6, 93, 96, 99, 7, 8, 9, 94, 95, 97, 98, 192)
    assert ck["record"]["n_params"] == sum(p.numel() for p in model.parameters())
    assert ck["record"]["guidance"] == imagegen.load(NAME).guidance


def test_its_recorded_int8_cost_is_within_a_hundredth():
    """The int8 cost its record holds (int8_check, imagegen-convert's; the head and the first block's feed-forward
    input float32) is within precision.INT8_MAX_COST, so sampling's precision=auto may take int8 for it."""
    from imagegen.precision import INT8_MAX_COST, int8_cost
    record = json.loads((shipped.SHIPPED / f"{NAME}.json").read_text())["record"]
    assert record["int8_check"]["images"] == 500 and 0 <= int8_cost(record) <= INT8_MAX_COST


@pytest.mark.slow
def test_its_bits_per_dim_on_500_test_images_match_its_record_and_card():
    from imagegen.ops.dense import int8_weights
    from imagegen.ops.int8 import can_int8
    x, y = load_split("cifar10", shared_data("cifar10"), "test")
    module = imagegen.load(NAME).module
    with torch.no_grad():
        bpd = bits_per_dim(module, x[:500], 32, "cpu", labels=y[:500])
    record = json.loads((shipped.SHIPPED / f"{NAME}.json").read_text())["record"]
    assert record["test_check"]["images"] == 500 and bpd == pytest.approx(record["test_check"]["bits_per_dim"],
                                                                          abs=1e-5)
    stated = re.search(r"first 500: ([0-9]\.[0-9]{4})", (shipped.SHIPPED / f"{NAME}.md").read_text())
    assert stated, "the card states no bits/dim on the first 500 test images"
    assert bpd == pytest.approx(float(stated.group(1)), abs=1e-4)
    if can_int8() is None:                        # the int8 cost the record holds (what precision=auto weighs)
        with torch.no_grad(), int8_weights(module):
            int8 = bits_per_dim(module, x[:500], 32, "cpu", labels=y[:500])
        assert int8 == pytest.approx(record["int8_check"]["int8"], abs=1e-3)
