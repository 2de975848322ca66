"""The colour judge (tools.judge): it trains on a tiny CIFAR fixture and round-trips through
its files, a changed byte in its weights is refused in one sentence, and label_accuracy reads the shipped
judge for CIFAR-10 models (the small CNN for MNIST, or when asked for)."""
import json
from pathlib import Path

import pytest
import torch

from fixtures import one_sentence
from tools import judge, label_accuracy
from imagegen.data.splits import load_splits
from imagegen.errors import UserError

WIDTHS = ["4", "8", "8"]


@pytest.fixture
def judge_file(cifar_root, tmp_path):
    judge.main(["--data-root", str(cifar_root), "--out", str(tmp_path / "j"), "--epochs", "1", "--batch-size", "4",
                "--widths", *WIDTHS])
    return tmp_path / "j.safetensors"


def test_judge_trains_a_step_and_round_trips_through_its_files(cifar_root, judge_file):
    test = load_splits("cifar10", str(cifar_root), ("test",), val_fraction=0.0)["test"]
    net, meta = judge.load(judge_file)
    torch.manual_seed(0)
    fresh = judge.Judge([4, 8, 8])
    assert any(not torch.equal(a, b) for a, b in zip(net.state_dict().values(), fresh.state_dict().values()))
    assert meta["architecture"]["widths"] == [4, 8, 8] and meta["record"]["epochs"] == 1
    assert judge.accuracy(net, *test) == meta["record"]["test_accuracy"]      # the same net as the one trained
    card = judge_file.with_suffix(".md").read_text()
    assert "python -m tools.judge --data-root" in card and "test accuracy" in card


def test_a_changed_byte_in_the_weights_is_refused(judge_file):
    data = bytearray(judge_file.read_bytes())
    data[-3] ^= 1
    judge_file.write_bytes(bytes(data))
    with pytest.raises(UserError) as e:
        judge.load(judge_file)
    assert "weights_sha256" in one_sentence(e)


def test_a_config_of_another_format_is_refused(judge_file):
    config = judge_file.with_suffix(".json")
    config.write_text(json.dumps({**json.loads(config.read_text()), "format": "imagegen/1"}))
    with pytest.raises(UserError) as e:
        judge.load(judge_file)
    assert "imagegen-judge/1" in one_sentence(e)


def test_label_accuracy_reads_the_shipped_judge_for_cifar10_models():
    shipped = judge.SHIPPED["cifar10"]
    assert label_accuracy.pick_judge(None, "cifar10") == shipped
    assert label_accuracy.pick_judge(None, "mnist") is None                # MNIST: the small CNN as before
    assert label_accuracy.pick_judge("small", "cifar10") is None           # forced
    assert label_accuracy.pick_judge("mine.pt", "cifar10") is None         # the small CNN's own file
    assert label_accuracy.pick_judge("mine.safetensors", "mnist") == Path("mine.safetensors")
    net, meta = judge.load(shipped)                                         # its sha256 checks out
    assert meta["record"]["test_accuracy"] >= 0.85 and meta["record"]["test_images"] == 10000
    assert shipped.stat().st_size <= 16 * 2 ** 20


def test_a_colour_judge_on_grey_digits_is_refused(judge_file, mnist_root):
    from argparse import Namespace
    from imagegen.data.sets import dataset_info

    args = Namespace(judge=str(judge_file), epochs=1, seed=0)
    with pytest.raises(UserError) as e:
        label_accuracy.judge(args, None, dataset_info("mnist"), "mnist")
    assert "--judge small" in one_sentence(e)


def test_the_same_command_trains_the_same_weights(cifar_root, judge_file, tmp_path):
    """What the card's "same weights expected" rests on: the seed fixes the weights on one thread."""
    judge.main(["--data-root", str(cifar_root), "--out", str(tmp_path / "again"), "--epochs", "1", "--batch-size",
                "4", "--widths", *WIDTHS])
    assert (tmp_path / "again.safetensors").read_bytes() == judge_file.read_bytes()
    judge.main(["--data-root", str(cifar_root), "--out", str(tmp_path / "seed1"), "--epochs", "1", "--batch-size",
                "4", "--widths", *WIDTHS, "--seed", "1"])
    assert (tmp_path / "seed1.safetensors").read_bytes() != judge_file.read_bytes()
