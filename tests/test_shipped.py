"""The shippable form (.safetensors + .json, imagegen-convert), names of shipped models, the Python API
and imagegen-sample's class grids."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import imagegen
from imagegen.store import checkpoint, shipped
from imagegen.commands.convert import convert
from imagegen.data.splits import load_split
from imagegen.errors import UserError
from imagegen.commands.evaluate import evaluate_on
from imagegen.world import World
from imagegen.commands.sample import run_sample
from imagegen.bits_per_dim import bits_per_dim
from fixtures import convert_cfg, mnist_best_pt

MODEL = {"attention": "linear", "attention_options": {"impl": "chunked"}, "n_layers": 1, "d_model": 16,
         "n_heads": 2, "d_ff": 32, "head": "categorical", "n_mixtures": 10, "dropout": 0.0, "num_classes": 10}


@pytest.fixture
def run_checkpoint(tmp_path, mnist_root):
    """A best.pt of a (random) class-conditional MNIST model, with an averaged copy of its weights."""
    return mnist_best_pt(tmp_path, mnist_root, MODEL)


def test_convert_writes_the_averaged_weights_and_a_config_that_loads_anywhere(run_checkpoint, tmp_path, mnist_root):
    path, ema = run_checkpoint
    record = convert(convert_cfg(path, tmp_path / "ship" / "digits", mnist_root), torch.device("cpu"))
    weights = tmp_path / "ship" / "digits.safetensors"
    meta = json.loads(weights.with_suffix(".json").read_text())
    assert meta["config"]["model"]["attention_options"]["impl"] == "auto"     # the loading machine's choice
    assert meta["config"]["data"]["root"] == str(mnist_root) and meta["record"]["guidance"] == 2.0   # data.root=
    assert record["step"] == 7 and record["averaged_weights"] and record["n_params"] == sum(
        p.numel() for p in ema.parameters())
    model = imagegen.load(weights)
    for name, value in ema.state_dict().items():
        assert torch.equal(model.module.state_dict()[name], value)
    x, y = load_split("mnist", mnist_root, "test")
    expected = bits_per_dim(ema, x[:4], 8, "cpu", labels=y[:4])
    assert record["test_check"]["bits_per_dim"] == pytest.approx(expected, rel=1e-6)
    assert model.guidance == 2.0 and model.class_names == [str(d) for d in range(10)]


@pytest.mark.slow
def test_api_generates_completes_and_scores_like_the_commands(run_checkpoint, tmp_path, mnist_root):
    path, _ = run_checkpoint
    model = imagegen.load(path)
    images = model.generate(labels=[3, 4], guidance=1.5, seed=1)
    assert images.shape == (2, 28, 28, 1) and images.dtype == np.uint8
    assert np.array_equal(images, model.generate(labels=[3, 4], guidance=1.5, seed=1))
    halves = model.complete(images, rows=14, n=3, labels=[3, 4])
    assert halves.shape == (2, 3, 28, 28, 1)
    assert np.array_equal(halves[:, :, :14], np.repeat(images[:, None, :14], 3, axis=1))
    x, y = load_split("mnist", mnist_root, "test")
    ours = model.bits_per_dim(x[:6].numpy().reshape(6, 28, 28, 1), labels=y[:6])
    cfg = {"checkpoint": str(path), "split": "test", "batch_size": 4, "max_images": 6, "lsh_draws": 1, "lsh_seed": 0,
           "precision": "float32", "labels": True, "progress": False, "data": {"root": None}}
    assert evaluate_on(cfg, torch.device("cpu"), World())["bits_per_dim"] == pytest.approx(ours, rel=1e-9)
    with pytest.raises(UserError, match="one label per image"):
        model.bits_per_dim(x[:6].numpy().reshape(6, 28, 28, 1), labels=y[:5])
    with pytest.raises(UserError, match="images must be"):
        model.bits_per_dim(np.zeros((2, 32, 32, 3), np.uint8))


def test_damaged_or_mismatched_safetensors_are_one_sentence(run_checkpoint, tmp_path, mnist_root):
    path, _ = run_checkpoint
    convert(convert_cfg(path, tmp_path / "m", mnist_root, check_images=0), torch.device("cpu"))
    weights, meta = tmp_path / "m.safetensors", tmp_path / "m.json"
    config = json.loads(meta.read_text())
    config["config"]["model"]["d_model"] = 32
    meta.write_text(json.dumps(config))
    with pytest.raises(UserError, match="do not fit the architecture"):
        imagegen.load(weights)
    meta.write_text(json.dumps({**config, "record": {"guidance": "strong"}}))
    with pytest.raises(UserError, match="no usable guidance"):
        checkpoint.load(weights)
    meta.write_text("{not json")
    with pytest.raises(UserError, match="not a readable config"):
        checkpoint.load(weights)
    meta.unlink()
    with pytest.raises(UserError, match="no config beside it"):
        checkpoint.load(weights)
    convert(convert_cfg(path, tmp_path / "m", mnist_root, check_images=0), torch.device("cpu"))
    weights.write_bytes(weights.read_bytes()[:300])
    with pytest.raises(UserError, match="not a readable .safetensors"):
        checkpoint.load(weights)


@pytest.mark.slow
def test_names_resolve_to_shipped_models_and_outputs_stay_out_of_the_package(run_checkpoint, tmp_path, mnist_root,
                                                                             monkeypatch):
    path, _ = run_checkpoint
    package = tmp_path / "package"
    convert(convert_cfg(path, package / "tiny-digits", mnist_root, check_images=0), torch.device("cpu"))
    monkeypatch.setattr(shipped, "SHIPPED", package)
    # a process-wide switch: not in the test run
    monkeypatch.setattr("imagegen.api.prebuilt_only", lambda: None)
    monkeypatch.chdir(tmp_path)
    assert shipped.names() == ["tiny-digits"] and shipped.resolve("tiny-digits") == package / "tiny-digits.safetensors"
    with pytest.raises(UserError, match="shipped model .tiny-digits"):
        checkpoint.load("no-such-model")
    assert checkpoint.eval_json("tiny-digits", "test") == Path("tiny-digits.test.json")
    cfg = {"checkpoint": "tiny-digits", "mode": "grid", "num_images": 64, "num_originals": 2, "completions": 2,
           "originals": "first", "row_names": False,
           "out": None, "nrow": 3, "scale": 1, "save_each": False, "overwrite": False, "sampler": "auto",
           "batch_size": 64,
           "temperature": 1.0, "seed": 0, "precision": "float32", "label": None, "labels": "auto", "guidance": None,
           "progress": False, "data": {"root": str(mnist_root), "download": None, "mirror": None}}
    run_sample(cfg, torch.device("cpu"))
    png = Image.open(tmp_path / "tiny-digits-grid.png")                  # in the current folder, not the package's
    assert png.size == (3 * 30 + 2, 10 * 30 + 2)                          # auto: a row of nrow images per class
    run_sample({**cfg, "labels": [4, 2], "out": "two.png"}, torch.device("cpu"))
    assert Image.open("two.png").size == (3 * 30 + 2, 2 * 30 + 2)
    run_sample({**cfg, "label": 5, "num_images": 4, "labels": "auto", "out": "five.png"}, torch.device("cpu"))
    assert Image.open("five.png").size == (3 * 30 + 2, 2 * 30 + 2)
    run_sample({**cfg, "mode": "complete", "out": "complete.png"}, torch.device("cpu"))
    assert list(package.iterdir()) and not list(package.glob("*.png"))


def test_no_shipped_config_names_a_path_of_the_machine_that_made_it():
    """The shipped .json files travel to every user: no absolute path (a data root, a run's source) in them."""
    for path in Path(imagegen.__file__).parent.parent.joinpath("checkpoints").glob("*.json"):
        def strings(v):
            if isinstance(v, dict):
                return [s for x in v.values() for s in strings(x)]
            return [s for x in v for s in strings(x)] if isinstance(v, list) else [v] if isinstance(v, str) else []
        absolute = [s for s in strings(json.loads(path.read_text())) if s.startswith(("/", "~")) or ":\\" in s]
        assert not absolute, f"{path.name} holds {absolute}"


def test_every_shipped_model_may_fetch_its_data_from_the_official_address():
    """mnist-linear recorded data.download true and cifar10-linear false: on a stranger's machine one fetched
    its test set for mode=complete and eval, the other stopped."""
    downloads = {p.stem: json.loads(p.read_text())["config"]["data"]["download"]
                 for p in shipped.SHIPPED.glob("*.json")}
    assert {"mnist-linear", "cifar10-linear"} <= set(downloads) and set(downloads.values()) == {True}, downloads


def test_no_shipped_card_or_demo_file_names_a_path_of_the_machine_that_made_it():
    """The model cards (checkpoints/*.md) and the demo sites' .json files (docs/demo/**) travel too: no
    absolute path of a machine (/work/..., /home/..., ~/..., C:\\...) in a card's text or a demo's strings;
    paths there are relative (../shared/data, ../runs) or names."""
    import re
    root = Path(__file__).resolve().parents[1]
    cards = sorted(root.joinpath("checkpoints").glob("*.md"))
    demos = sorted(root.joinpath("docs", "demo").rglob("*.json"))
    assert cards and demos
    machine_path = re.compile(r"(?:^|[\s=(`'\"\[<,:])((?:/[A-Za-z][\w.+-]*){2,}/?|~/[\w./-]+|[A-Za-z]:\\\S+)")
    for path in cards:
        found = [m.group(1) for m in machine_path.finditer(path.read_text())]
        assert not found, f"{path.relative_to(root)} holds {found}"

    def strings(v):
        if isinstance(v, dict):
            return [s for x in v.values() for s in strings(x)]
        return [s for x in v for s in strings(x)] if isinstance(v, list) else [v] if isinstance(v, str) else []
    for path in demos:
        absolute = [s for s in strings(json.loads(path.read_text())) if s.startswith(("/", "~")) or ":\\" in s]
        assert not absolute, f"{path.relative_to(root)} holds {absolute}"


@pytest.mark.parametrize("site, name", [("demo", "mnist-linear"), ("demo/cifar10", "cifar10-linear")])
def test_demo_sites_are_the_current_page_and_the_shipped_weights(site, name):
    """docs/demo and docs/demo/cifar10 are `imagegen-export` outputs: their page, sampler, worker and
    WebAssembly are imagegen/web's files as they are now, their config names the shipped model's
    architecture, and their weights are the shipped model's (8-bit weights within half a scale step)."""
    from safetensors.torch import load_file

    from imagegen.web.site import PAGE_FILES, WEB_DIR
    root = Path(__file__).resolve().parents[1] / "docs" / site
    for file in PAGE_FILES:
        assert (root / file).read_bytes() == (WEB_DIR / file).read_bytes(), f"docs/{site}/{file} is stale: re-export"
    model = imagegen.load(name).module
    config = json.loads((root / "config.json").read_text())
    assert config["context"] == list(model.context) and config["n_layers"] == len(model.blocks)
    weights, shipped_weights = load_file(root / "model.safetensors"), model.state_dict()
    for key, value in shipped_weights.items():
        got = weights[key]
        if got.dtype == torch.int8:
            scale = weights[key + "_scale"]                  # (out,): one per column of the (in, out) weight
            assert ((got.float() * scale - value).abs() <= scale / 2 + 1e-6).all(), key
        else:
            assert torch.equal(got, value), key


def test_convert_records_the_weights_sha256_and_load_refuses_other_weights(run_checkpoint, tmp_path, mnist_root):
    """A .safetensors altered into another valid model (a weight changed, its bytes flipped) is refused in
    one sentence; a .json of an older imagegen, without weights_sha256, still loads."""
    import hashlib
    from safetensors.torch import load_file, save_file
    from fixtures import one_sentence

    path, _ = run_checkpoint
    convert(convert_cfg(path, tmp_path / "m", mnist_root, check_images=0), torch.device("cpu"))
    weights, meta = tmp_path / "m.safetensors", tmp_path / "m.json"
    recorded = json.loads(meta.read_text())["weights_sha256"]
    assert recorded == hashlib.sha256(weights.read_bytes()).hexdigest()
    good = weights.read_bytes()
    tensors = load_file(weights)
    save_file({**tensors, "ln_f.weight": tensors["ln_f.weight"] * 1.01}, weights)
    with pytest.raises(UserError, match="does not match the weights_sha256 recorded in m.json") as e:
        imagegen.load(weights)
    one_sentence(e)
    flipped = bytearray(good)
    flipped[-1] ^= 0x01                                   # the last byte of the last float: still a valid file
    weights.write_bytes(bytes(flipped))
    with pytest.raises(UserError, match="does not match the weights_sha256"):
        checkpoint.load(weights)
    older = json.loads(meta.read_text())
    del older["weights_sha256"]
    meta.write_text(json.dumps(older))
    assert imagegen.load(weights).module is not None      # no checksum: read as it is


def test_every_shipped_model_records_the_sha256_of_its_weights():
    import hashlib
    found = sorted(shipped.SHIPPED.glob("*.safetensors"))
    assert found
    for weights in found:
        meta = json.loads(weights.with_suffix(".json").read_text())
        assert meta["weights_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest(), weights.name
