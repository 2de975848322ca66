"""The judges (tools.judge): the colour judge trains on a tiny CIFAR fixture and the digit judge on a tiny
MNIST one (28x28x1, never mirrored), both round-trip through their files, a changed byte in the weights is
refused in one sentence, and label_accuracy reads the shipped judge for CIFAR-10 and MNIST models (the small
CNN when asked for)."""
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


@pytest.fixture
def digit_judge_file(mnist_root, tmp_path):
    judge.main(["--dataset", "mnist", "--data-root", str(mnist_root), "--out", str(tmp_path / "d"), "--epochs", "1",
                "--batch-size", "4", "--widths", *WIDTHS])
    return tmp_path / "d.safetensors"


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


def test_label_accuracy_reads_the_shipped_judges_for_cifar10_and_mnist_models():
    shipped = judge.SHIPPED["cifar10"]
    assert label_accuracy.pick_judge(None, "cifar10") == shipped
    assert label_accuracy.pick_judge(None, "mnist") == judge.SHIPPED["mnist"]
    assert label_accuracy.pick_judge(None, "fashion_mnist") is None         # no judge ships: the small CNN
    assert label_accuracy.pick_judge("small", "cifar10") is None           # forced
    assert label_accuracy.pick_judge("small", "mnist") is None
    assert label_accuracy.pick_judge("mine.pt", "cifar10") is None         # the small CNN's own file
    assert label_accuracy.pick_judge("mine.safetensors", "mnist") == Path("mine.safetensors")
    net, meta = judge.load(shipped)                                         # its sha256 checks out
    assert meta["record"]["test_accuracy"] >= 0.85 and meta["record"]["test_images"] == 10000
    assert shipped.stat().st_size <= 16 * 2 ** 20 and net.dataset == "cifar10"    # its .json names no data set
    digits, meta = judge.load(judge.SHIPPED["mnist"])
    assert meta["record"]["test_accuracy"] >= 0.993 and meta["record"]["test_images"] == 10000
    assert meta["record"]["train_images"] == 60000 and not digits.mirror
    assert judge.SHIPPED["mnist"].stat().st_size < 2 * 2 ** 20


def test_a_colour_judge_on_grey_digits_is_refused(judge_file, mnist_root):
    from argparse import Namespace
    from imagegen.data.sets import dataset_info

    args = Namespace(judge=str(judge_file), epochs=1, seed=0)
    with pytest.raises(UserError) as e:
        label_accuracy.judge(args, None, dataset_info("mnist"), "mnist")
    assert "--judge small" in one_sentence(e)


def test_the_digit_judge_trains_on_28x28x1_and_never_mirrors(mnist_root, digit_judge_file):
    test = load_splits("mnist", str(mnist_root), ("test",), val_fraction=0.0)["test"]
    net, meta = judge.load(digit_judge_file)
    assert net.net[0].in_channels == 1 and meta["architecture"]["dataset"] == "mnist" and not net.mirror
    assert meta["record"]["tta"] == "none" and meta["record"]["train_images"] == 40
    assert meta["record"]["macs"] == judge.macs([4, 8, 8], net.info)
    assert judge.accuracy(net, *test) == meta["record"]["test_accuracy"]
    with torch.no_grad():
        plain = torch.softmax(net(judge.images(net, test[0])), -1)
    assert torch.equal(judge.class_probs(net, test[0]), plain)              # no mirror image averaged in
    assert "no mirror" in digit_judge_file.with_suffix(".md").read_text()


def test_the_digit_recipe_shifts_but_never_flips():
    assert not judge.RECIPES["mnist"].mirror and judge.RECIPES["cifar10"].mirror
    x = torch.rand(64, 1, 28, 28)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(judge.augment(x, g, shift=0, mirror=False, pad="constant"), x)
    assert not torch.equal(judge.augment(x, g, shift=0, mirror=True), x)    # the colour judge's flips
    moved = judge.augment(x, g, shift=2, mirror=False, pad="constant")
    assert moved.shape == x.shape and not torch.equal(moved, x)


def test_a_digit_judge_round_trips_to_the_same_predictions(mnist_root, tmp_path):
    train = load_splits("mnist", str(mnist_root), ("train",), val_fraction=0.0)["train"]
    net = judge.train(*train, "mnist", [4, 8, 8], epochs=1, batch=8, log=lambda _: None)
    path, _ = judge.save(tmp_path / "r", net, {"test_accuracy": 0.5})
    back, meta = judge.load(path)
    assert back.dataset == "mnist" and back.info.channels == 1
    assert torch.equal(judge.class_probs(back, train[0]), judge.class_probs(net, train[0]))


def test_label_accuracy_reads_the_digit_judge_for_mnist_and_refuses_it_for_colour(digit_judge_file):
    from argparse import Namespace
    from imagegen.data.sets import dataset_info

    args = Namespace(judge=str(digit_judge_file), epochs=1, seed=0)
    probs_of, description = label_accuracy.judge(args, None, dataset_info("mnist"), "mnist")
    assert description.startswith("d.safetensors") and "no mirror" in description
    assert probs_of(torch.zeros(3, 784, dtype=torch.uint8)).shape == (3, 10)
    with pytest.raises(UserError) as e:
        label_accuracy.judge(args, None, dataset_info("cifar10"), "cifar10")
    assert "28x28x1" in one_sentence(e) and "--judge small" in one_sentence(e)


def test_the_same_command_trains_the_same_weights(cifar_root, judge_file, tmp_path):
    """What the card's "same weights expected" rests on: the seed fixes the weights on one thread."""
    judge.main(["--data-root", str(cifar_root), "--out", str(tmp_path / "again"), "--epochs", "1", "--batch-size",
                "4", "--widths", *WIDTHS])
    assert (tmp_path / "again.safetensors").read_bytes() == judge_file.read_bytes()
    judge.main(["--data-root", str(cifar_root), "--out", str(tmp_path / "seed1"), "--epochs", "1", "--batch-size",
                "4", "--widths", *WIDTHS, "--seed", "1"])
    assert (tmp_path / "seed1.safetensors").read_bytes() != judge_file.read_bytes()
