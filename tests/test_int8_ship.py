"""The shipped form with 8-bit weights (imagegen-convert precision=int8): each Dense layer's weight as int8
beside its float32 scales, read back as float32 q * scale; the export's int8 model.safetensors (the page's
side: test_export.py's test_int8_page_matches_python_with_the_dequantized_weights)."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import imagegen
from commands import call, one_line_error
from fixtures import convert_cfg, mnist_best_pt, one_sentence
from imagegen.bits_per_dim import bits_per_dim
from imagegen.commands.convert import convert
from imagegen.commands.export import export
from imagegen.data.catalogue import DATASETS
from imagegen.data.splits import load_split
from imagegen.errors import UserError
from imagegen.model.transformer import build_model
from imagegen.ops.dense import Dense
from imagegen.ops.int8 import quantize_columns

pytestmark = pytest.mark.usefixtures("one_thread")

# Dense weights dominate (as in the shipped models): 426k of the 470k parameters
MODEL = {"attention": "linear", "attention_options": {}, "n_layers": 2, "d_model": 128, "n_heads": 4, "d_ff": 512,
         "head": "categorical", "n_mixtures": 10, "dropout": 0.0, "num_classes": 0}


@pytest.fixture
def run_checkpoint(tmp_path, mnist_root):
    """A best.pt of a (random) MNIST model with an averaged copy of its weights (the one converted)."""
    return mnist_best_pt(tmp_path, mnist_root, MODEL, ema_noise=0.05)


def convert_at(path, out, mnist_root, precision, check_images=0):
    return convert(convert_cfg(path, out, mnist_root, check_images, guidance=1.0, precision=precision),
                   torch.device("cpu"))


def dense_names(model):
    return [f"{name}.weight" for name, m in model.named_modules() if isinstance(m, Dense)]


def test_int8_round_trip_loads_q_times_scale_and_the_rest_bit_for_bit(run_checkpoint, tmp_path, mnist_root):
    path, ema = run_checkpoint
    record = convert_at(path, tmp_path / "m8", mnist_root, "int8", check_images=4)
    assert record["precision"] == "int8"
    assert json.loads((tmp_path / "m8.json").read_text())["record"]["precision"] == "int8"
    raw = load_file(tmp_path / "m8.safetensors")
    dense = dense_names(ema)
    assert len(dense) == 2 * 4 + 1
    expected = {}
    for name, value in ema.state_dict().items():
        if name in dense:
            q, s = quantize_columns(value)
            assert raw[name].dtype == torch.int8 and torch.equal(raw[name], q)
            assert raw[name + "_scale"].dtype == torch.float32 and torch.equal(raw[name + "_scale"], s)
            expected[name] = q.float() * s
            assert (expected[name] - value).abs().max() <= s.max() / 2 * (1 + 1e-6)     # within half a step
            assert torch.equal(quantize_columns(expected[name])[0], q)       # q * s quantizes to itself again
            assert torch.equal(quantize_columns(expected[name])[1], s)
        else:
            assert raw[name].dtype == torch.float32
            expected[name] = value
    loaded = imagegen.load(tmp_path / "m8.safetensors").module.state_dict()
    assert sorted(loaded) == sorted(expected)
    for name, value in expected.items():
        assert loaded[name].dtype == torch.float32 and torch.equal(loaded[name], value), name
    # the recorded check scored the weights as they load, not the float32 ones
    quantized = build_model(MODEL, DATASETS["mnist"])
    quantized.load_state_dict(expected)
    x, _ = load_split("mnist", mnist_root, "test")
    assert record["test_check"]["bits_per_dim"] == pytest.approx(bits_per_dim(quantized, x[:4], 8, "cpu"), rel=1e-6)


def test_int8_file_is_about_a_quarter_of_the_float32_one(run_checkpoint, tmp_path, mnist_root):
    path, _ = run_checkpoint
    assert convert_at(path, tmp_path / "m32", mnist_root, "float32")["precision"] == "float32"
    convert_at(path, tmp_path / "m8", mnist_root, "int8")
    f32, i8 = (tmp_path / "m32.safetensors").stat().st_size, (tmp_path / "m8.safetensors").stat().st_size
    assert i8 < 0.35 * f32, (i8, f32)


@pytest.fixture
def int8_file(run_checkpoint, tmp_path, mnist_root):
    """The run's checkpoint converted to int8: (m8.safetensors's path, its tensors as written)."""
    convert_at(run_checkpoint[0], tmp_path / "m8", mnist_root, "int8")
    weights = tmp_path / "m8.safetensors"
    return weights, load_file(weights)


def test_damaged_int8_files_are_one_sentence(int8_file):
    weights, good = int8_file
    name = "blocks.0.ff.0.weight"
    cases = [({k: v for k, v in good.items() if k != name + "_scale"},
              f"its int8 weight {name} has no scales {name}_scale beside it"),
             ({**good, name + "_scale": good[name + "_scale"][:-1]}, "where a weight (in, out) takes float32 scales"),
             ({**good, name + "_scale": good[name + "_scale"].double()}, "where a weight (in, out) takes float32"),
             ({**good, name + "_scale": -good[name + "_scale"]}, "are not all positive and finite"),
             ({**good, name + "_scale": torch.full_like(good[name + "_scale"], 3e38)},   # q * scale: inf
              "are not all positive and finite up to"),
             ({**good, name: good[name].float()}, f"it holds scales {name}_scale but no int8 weight {name}"),
             ({**good, "ln_f.weight": good["ln_f.weight"].to(torch.int8)}, "int8 weight ln_f.weight has no scales")]
    for tensors, message in cases:
        save_file(tensors, weights)
        with pytest.raises(UserError, match="is damaged or was edited") as e:
            imagegen.load(weights)
        assert message in one_sentence(e) and "diverged" not in str(e.value)


def test_int8_scales_changed_to_other_valid_ones_are_refused(int8_file):
    """Positive finite scales of another model pass every structural check; the recorded sha256 refuses them."""
    weights, good = int8_file
    name = "blocks.0.ff.0.weight_scale"
    save_file({**good, name: good[name] * 2}, weights)
    with pytest.raises(UserError, match="does not match the weights_sha256 recorded in m8.json") as e:
        imagegen.load(weights)
    one_sentence(e)


def test_bad_precision_is_one_sentence(run_checkpoint, tmp_path, mnist_root):
    path, _ = run_checkpoint
    with pytest.raises(UserError, match="precision must be float32 or int8") as e:
        convert_at(path, tmp_path / "m", mnist_root, "int4")
    one_sentence(e)
    with pytest.raises(UserError, match="precision must be float32 or int8 .*got 'bfloat16'"):
        export({"checkpoint": str(path), "out": str(tmp_path / "site"), "examples": 0, "precision": "bfloat16",
                "data": {"root": None}})
    one_line_error(call("imagegen-convert", f"checkpoint={path}", f"out={tmp_path / 'm'}", "precision=int4"),
                   "precision must be float32 or int8")
    assert not list(tmp_path.glob("m.*")) and not (tmp_path / "site").exists()


def test_export_of_an_int8_model_ships_its_int8_weights(run_checkpoint, tmp_path, mnist_root):
    """export takes int8 from a model converted at int8, and writes the same q and scales."""
    path, _ = run_checkpoint
    convert_at(path, tmp_path / "m8", mnist_root, "int8")
    sizes = export({"checkpoint": str(tmp_path / "m8.safetensors"), "out": str(tmp_path / "site8"), "examples": 0,
                    "data": {"root": None}})
    shipped, site = load_file(tmp_path / "m8.safetensors"), load_file(tmp_path / "site8" / "model.safetensors")
    assert sorted(site) == sorted(shipped) and all(torch.equal(site[k], v) for k, v in shipped.items())
    sizes32 = export({"checkpoint": str(path), "out": str(tmp_path / "site32"), "examples": 0, "data": {"root": None}})
    assert sizes["model.safetensors"] < 0.35 * sizes32["model.safetensors"]
    float32 = load_file(tmp_path / "site32" / "model.safetensors")
    assert all(v.dtype == torch.float32 for v in float32.values()) and not any(k.endswith("_scale") for k in float32)


def test_convert_records_the_int8_cost_and_a_shipped_model_converts_again(run_checkpoint, tmp_path, mnist_root):
    """The check scores its images with int8 products too (int8_check: what sampling's precision=auto
    weighs); converting the shipped file again (here to int8) keeps its record and adds the new checks."""
    from imagegen.ops.build import kernel_error
    from imagegen.ops.dense import int8_weights
    from imagegen.ops.int8 import can_int8
    from imagegen.precision import keep_out_of_int8
    if can_int8() is not None:
        pytest.skip(f"int8 products unavailable: {can_int8()}")
    path, ema = run_checkpoint
    first = convert_at(path, tmp_path / "m", mnist_root, "float32", check_images=3)
    x, _ = load_split("mnist", mnist_root, "test")
    with torch.no_grad(), int8_weights(keep_out_of_int8(ema)):              # as every int8 run keeps them
        int8 = bits_per_dim(ema, x[:3], 8, "cpu")
    assert first["int8_check"] == {"images": 3, "float32": first["test_check"]["bits_per_dim"],
                                   "int8": pytest.approx(int8, rel=1e-6),    # per row: at any batch, as here
                                   "product": "per row" if kernel_error("cpu") is None else "per call"}
    assert first["int8_check"]["int8"] != first["int8_check"]["float32"]
    again = convert_at(tmp_path / "m.safetensors", tmp_path / "m8", mnist_root, "int8", check_images=3)
    assert again["step"] == 7 and again["source"] == first["source"] and again["precision"] == "int8"
    assert json.loads((tmp_path / "m8.json").read_text())["record"] == json.loads(json.dumps(again))


def test_sampling_auto_takes_int8_only_for_a_small_recorded_cost_where_faster(monkeypatch):
    from imagegen import precision
    from imagegen.dtypes import INT8
    from imagegen.ops.int8 import int8_form
    from imagegen.tuning import probe
    cpu, dims = torch.device("cpu"), (128, 512)
    record = {"int8_check": {"images": 500, "float32": 0.8795, "int8": 0.8801}}
    assert precision.int8_cost(record) == pytest.approx(0.0006) and precision.int8_cost({}) is None
    verdicts = []
    monkeypatch.setattr(precision, "auto_bf16", lambda *a, **k: (False, "bfloat16 slower here"))
    monkeypatch.setattr(probe, "decide", lambda key, measure: verdicts.append(key) or probe.Verdict(
        key, 2.1, 1.0, True, "cached", "probes.json"))
    assert precision.decide_precision("auto", cpu, dims=dims, batch=64, record=record).value == INT8
    assert verdicts == [f"int8-decode:{int8_form() or 'fbgemm'}:N64:D128:F512"]   # the form timed names the verdict
    costly = {"int8_check": {"images": 500, "float32": 0.8795, "int8": 0.8995}}
    for other in (None, {}, costly):                   # no cost recorded, or too high: float32, nothing timed
        assert precision.decide_precision("auto", cpu, dims=dims, batch=64, record=other).value == torch.float32
    assert precision.decide_precision("auto", cpu, dims=dims, record=record).value == torch.float32   # evaluation
    assert len(verdicts) == 1
    assert "above the 0.01 allowed" in precision.decide_precision("auto", cpu, dims=dims, batch=64,
                                                                  record=costly).reason
