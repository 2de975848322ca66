"""bfloat16 where the hardware is fast at it: the capability rule, bfloat16 decoding against float32
decoding (the one-call C++ step and the per-module loop, linear and softmax), and imagegen-eval's
precision option."""

import pytest
import torch

from imagegen import precision
from imagegen.tuning import machine
from imagegen.errors import UserError
from imagegen.tuning.choice import Choice
from imagegen.ops.dense import dense
from imagegen.ops.layout import PACK_MIN_ROWS, can_pack, pack, panel_width, panels
from commands import TINY, eval_at, one_line_error, run
from fixtures import decode_params, scaled_model, skip_without_cpu_kernel

CPU = torch.device("cpu")


@pytest.mark.parametrize("report, fast, why", [
    ({"amx": True, "avx512_bf16": True}, True, "AMX"),
    ({"amx": True, "avx512_bf16": False}, True, "AMX"),
    ({"amx": False, "avx512_bf16": True}, True, "AVX512-BF16"),
    ({"amx": False, "avx512_bf16": False}, False, "neither"),
])
def test_capability_rule_on_mocked_cpu_reports(monkeypatch, report, fast, why):
    ok, reason = machine.fast_bf16(CPU, report)
    assert ok is fast and why in reason
    monkeypatch.setattr(machine, "cpu_bf16_report", lambda: report)
    assert precision.decide_bf16("auto", CPU).value is fast
    assert precision.decide_bf16(False, CPU).value is False and precision.decide_bf16(True, CPU).value is True
    assert precision.decide_precision("auto", CPU).value == (torch.bfloat16 if fast else torch.float32)
    assert precision.decide_precision("float32", CPU).value == torch.float32
    assert precision.decide_precision("bfloat16", CPU).value == torch.bfloat16
    header = precision.decide_bf16("auto", CPU).reason
    assert header.startswith("bfloat16 autocast" if fast else "float32") and why in header


SLOW, FAST = {"amx": False, "avx512_bf16": False}, {"amx": False, "avx512_bf16": True}


def test_slow_bfloat16_asked_for_says_so(monkeypatch):
    monkeypatch.setattr(machine, "cpu_bf16_report", lambda: SLOW)
    assert "emulated" in precision.slow_bf16_note(torch.bfloat16, CPU)
    assert precision.slow_bf16_note(torch.float32, CPU) is None
    assert precision.decide_bf16(True, CPU) == Choice(True, "bfloat16 autocast (train.bf16=true; slow here: CPU has "
                                                            "neither AMX nor AVX512-BF16, so bfloat16 products are "
                                                            "emulated)")
    assert precision.decide_bf16(False, CPU).reason == "float32 (train.bf16=false)"
    monkeypatch.setattr(machine, "cpu_bf16_report", lambda: FAST)
    assert precision.slow_bf16_note(torch.bfloat16, CPU) is None
    assert precision.decide_bf16(True, CPU).reason == "bfloat16 autocast (train.bf16=true)"


@pytest.mark.parametrize("report, settings, names, note", [
    (FAST, ["float32", "auto"], ["float32", "bfloat16"], None),
    (SLOW, ["float32", "auto"], ["float32"], "bfloat16 not measured: CPU has neither AMX nor AVX512-BF16 "
                                             "(key=[float32,bfloat16] measures it anyway)."),
    (SLOW, ["float32", "bfloat16"], ["float32", "bfloat16"], "emulated"),
    (SLOW, ["auto", "float32", "float32"], ["float32"], "not measured"),
    (FAST, ["bfloat16", "auto"], ["bfloat16"], None),
])
def test_benchmark_precision_lists_measure_bfloat16_where_fast_or_named(monkeypatch, report, settings, names, note):
    monkeypatch.setattr(machine, "cpu_bf16_report", lambda: report)
    got, got_note = precision.resolve_precisions(settings, CPU, "key")
    assert got == names
    assert got_note is None if note is None else note in got_note


def test_cpu_report_falls_back_to_cpuinfo_flags(monkeypatch, tmp_path):
    """Where torch has no probe, the /proc/cpuinfo flags decide, by capability and not by vendor."""
    info = tmp_path / "cpuinfo"
    info.write_text("vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse avx512f avx512_bf16 avx512vl\n")
    monkeypatch.setattr(machine, "_torch_flag", lambda name: None)
    monkeypatch.setattr(machine, "cpuinfo", lambda: info.read_text())
    machine.cpu_bf16_report.cache_clear()
    try:
        assert machine.cpu_bf16_report() == {"amx": False, "avx512_bf16": True}
    finally:
        machine.cpu_bf16_report.cache_clear()


def test_cpuinfo_parser_reads_the_flags_line(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Some CPU\nflags\t\t: fpu amx_bf16 amx_tile\n")
    monkeypatch.setattr(machine, "cpuinfo", lambda: info.read_text())
    assert {"amx_bf16", "amx_tile"} <= machine.cpu_flags() and machine.cpu_name() == "Some CPU"
    monkeypatch.setattr(machine, "cpuinfo", lambda: "")
    assert machine.cpu_flags() == set()


def test_bad_precision_is_one_sentence():
    with pytest.raises(UserError, match="precision must be one of float32, bfloat16, auto, int8, not 'half'"):
        precision.decide_precision("half", CPU)


# Tolerance of bfloat16 decoding, stated: over 300 steps, every distribution parameter within
# 0.05 + 2% of its float32 value's magnitude (bfloat16 rounds to 2^-9 relative, three blocks deep),
# and the 256-way probabilities within 0.01 in total variation at every step. Observed for these
# models (parameters up to 2.1): at most 0.015 absolute and 0.002 in total variation.
ATOL, RTOL, MAX_TV = 5e-2, 2e-2, 1e-2


def assert_close_distributions(model, got, want):
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    p, q = model.head.probs(got.flatten(0, 1)), model.head.probs(want.flatten(0, 1))
    assert (p - q).abs().sum(-1).max().item() / 2 < MAX_TV


@pytest.mark.parametrize("batch", [3, 8])   # 8: weights prepacked for oneDNN (ops.layout.pack), where it can
@pytest.mark.parametrize("attention, whole_model_kernel, impl, bf16_cache", [
    ("linear", True, "auto", False),        # the one-call C++ step
    ("linear", False, "auto", False),       # the per-module loop over the fused kernel's step
    ("linear", False, "chunked", False),    # the per-module loop with S, Z as torch tensors
    ("softmax", False, "auto", False),      # KV cache float32
    ("softmax", False, "auto", True),       # KV cache in bfloat16
])
@pytest.mark.slow
def test_bfloat16_decoding_tracks_float32(attention, whole_model_kernel, impl, bf16_cache, batch):
    model = scaled_model(attention, impl=impl)
    for block in model.blocks:
        block.attn.bf16_cache = bf16_cache
    x = torch.randint(0, 256, (batch, model.length), generator=torch.Generator().manual_seed(1))
    want, _ = decode_params(model, x, torch.float32, whole_model_kernel)
    got, state = decode_params(model, x, torch.bfloat16, whole_model_kernel)
    if attention == "linear" and impl == "auto" and state.layers[0].attn.form != "fused":
        skip_without_cpu_kernel("the fused CPU kernel is unavailable")
    assert (state.kernel is not None) == (whole_model_kernel and impl == "auto")
    layer = state.layers[0]
    assert layer.attn.qkv[0].dtype == layer.ff[1][0].dtype == torch.bfloat16       # converted once, here
    assert layer.attn.qkv[0].is_mkldnn == layer.ff[1][0].is_mkldnn == (batch >= PACK_MIN_ROWS and can_pack())
    sums = layer.attn.S if attention == "linear" else layer.attn.k
    assert sums.dtype == (torch.bfloat16 if bf16_cache else torch.float32)
    assert want.abs().max() > 1.0                         # the parameters are not all near zero
    assert_close_distributions(model, got, want)
    # and bfloat16 decoding is not secretly float32: it differs somewhere
    assert (got - want).abs().max() > 0


@pytest.mark.parametrize("batch, d_model", [(2, 64), (8, 64), (8, 40)])   # 40: rows not a multiple of 16 floats
def test_one_call_bfloat16_step_equals_the_module_loop(batch, d_model):
    """The C++ decode_step (its own residual add + LayerNorm pass, the products prepacked from
    batch 5) and the per-module loop (torch's add and LayerNorm) round at the same points, so they
    agree to float32 accuracy in bfloat16 too (ties in rounding aside)."""
    model = scaled_model("linear", length=100, d_model=d_model)
    x = torch.randint(0, 256, (batch, model.length), generator=torch.Generator().manual_seed(2))
    fast, state = decode_params(model, x, torch.bfloat16, True)
    if state.kernel is None:
        skip_without_cpu_kernel("the fused CPU kernel is unavailable")
    slow, _ = decode_params(model, x, torch.bfloat16, False)
    torch.testing.assert_close(fast, slow, atol=1e-2, rtol=1e-2)


def test_without_onednn_packing_the_step_multiplies_plain_weights(monkeypatch):
    """Where oneDNN cannot prepack bfloat16 weights, the state keeps plain (in, out) bfloat16
    weights and both steps multiply through addmm, to the same parameters as the packed ones."""
    from imagegen.ops import layout
    model = scaled_model("linear", length=60)
    x = torch.randint(0, 256, (8, model.length), generator=torch.Generator().manual_seed(3))
    packed, _ = decode_params(model, x, torch.bfloat16)
    monkeypatch.setattr(layout, "can_pack", lambda dtype=None: False)
    for whole_model_kernel in (True, False):
        plain, state = decode_params(model, x, torch.bfloat16, whole_model_kernel)
        assert not state.layers[0].attn.qkv[0].is_mkldnn
        torch.testing.assert_close(plain, packed, atol=1e-2, rtol=1e-2)


def test_float32_state_uses_the_parameters_themselves():
    model = scaled_model("linear", length=20)
    layer = model.init_state(1, CPU, torch.float32).layers[0].attn
    assert layer.qkv[0] is model.blocks[0].attn.qkv.weight


@pytest.mark.slow
def test_eval_precision_option(mnist_root, tmp_path):
    run("imagegen-train", f"data.root={mnist_root}", f"run_dir={tmp_path}", "train.max_steps=3", *TINY)
    bpd = {p: eval_at(tmp_path / "last.pt", p) for p in ("float32", "bfloat16")}
    assert abs(bpd["bfloat16"] - bpd["float32"]) < 0.02 and bpd["bfloat16"] != bpd["float32"]
    one_line_error(run("imagegen-eval", f"checkpoint={tmp_path / 'last.pt'}", "precision=half", check=False),
                   "precision must be one of float32, bfloat16, auto")


@pytest.mark.parametrize("N, K, O, dtype", [(1, 256, 1024, torch.bfloat16), (3, 1024, 256, torch.bfloat16),
                                             (4, 64, 192, torch.bfloat16), (6, 64, 128, torch.bfloat16),
                                             (2, 64, 100, torch.bfloat16), (2, 64, 128, torch.float32),
                                             (1, 256, 768, torch.float32), (4, 1024, 256, torch.float32),
                                             (3, 7, 64, torch.float32), (9, 64, 128, torch.float32),
                                             (5, 64, 100, torch.bfloat16), (64, 1024, 256, torch.bfloat16),
                                             (256, 256, 768, torch.bfloat16)])
def test_decode_linear_against_float64(N, K, O, dtype):
    """The decoding step's product (C++; its own bfloat16 loop for up to 4 rows and O a multiple
    of 64, oneDNN with the weight prepacked by `layout.pack` from 5 rows, torch's addmm otherwise;
    float32 also with the weight in `layout.panels`, its own float32 loop) and `dense.dense` over
    the same weights against the float64 product of the same values: off by no more than the
    output's rounding (2^-8 relative for bfloat16) plus float32 summing."""
    from imagegen.ops.build import kernel_error, load_kernel
    if kernel_error("cpu") is not None:
        skip_without_cpu_kernel("the CPU kernel is unavailable")
    g = torch.Generator().manual_seed(N * K + O)
    x = torch.randn(N, K, generator=g)
    W, b = torch.randn(K, O, generator=g).to(dtype), torch.randn(O, generator=g).to(dtype)
    packed = pack(W, N)
    assert packed.is_mkldnn == (dtype == torch.bfloat16 and N >= PACK_MIN_ROWS and can_pack())
    exact = torch.addmm(b.double(), x.to(dtype).double(), W.double())
    rel = 2.0 ** -8 if dtype == torch.bfloat16 else 1e-6
    laid_out = [packed] + ([panels(W)] if dtype == torch.float32 and O % panel_width() == 0 else [])
    for w in laid_out:
        for got in (load_kernel("cpu").decode_linear(x, w, b), dense(x, (w, b))):
            assert got.dtype == dtype and got.shape == (N, O)
            assert ((got.double() - exact).abs() <= rel * exact.abs() + 1e-5 * K ** 0.5).all()
