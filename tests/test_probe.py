"""Choices by measurement (imagegen.tuning.probe): verdicts from mocked timings (faster, slower, within the
margin), the per-machine cache (reused; timed again when torch or the thread count changes; a damaged
or unreadable file ignored with a line), the rules when probes are off, and the two users: bfloat16
for `auto` precisions and the CPU kernel for impl=auto."""
import json
import time

import pytest
import torch

from imagegen import ops, precision
from imagegen.ops import dispatch, layout as layers
from imagegen.ops.dense import dense
from imagegen.tuning import machine, probe
from fixtures import skip_without_cpu_kernel

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("probes_on")      # tests/conftest.py: probes on, a cache of each test's own


class Timer:
    """A measure() returning fixed timings and counting its calls."""
    def __init__(self, baseline_ms, candidate_ms):
        self.result, self.calls = (baseline_ms, candidate_ms), 0

    def __call__(self):
        self.calls += 1
        return self.result


def forget():
    """A new process: nothing in memory, only the cache file."""
    probe._verdicts.clear()


@pytest.mark.parametrize("baseline, candidate, chosen", [
    (10.0, 5.0, True),        # the candidate twice as fast
    (10.0, 20.0, False),      # twice as slow
    (10.0, 9.0, False),       # 1.11x: faster, but within the margin
    (11.5, 10.0, True),       # exactly the margin
])
def test_verdict_from_mocked_timings(probes_on, baseline, candidate, chosen):
    verdict = probe.decide("x", Timer(baseline, candidate))
    assert verdict.chosen is chosen and verdict.ratio == pytest.approx(baseline / candidate)
    assert verdict.source == "measured" and verdict.path == str(probes_on)
    assert "cached in" in verdict.where()


def test_cache_is_reused_across_processes(probes_on):
    timer = Timer(10.0, 5.0)
    probe.decide("x", timer)
    assert probe.decide("x", timer).chosen and timer.calls == 1          # this process: from memory
    forget()
    again = probe.decide("x", Timer(5.0, 10.0))                           # would say the opposite if timed
    assert again.chosen and again.source == "cached" and again.ratio == 2.0
    entries = json.loads(probes_on.read_text())["entries"]
    (entry,) = entries.values()
    assert entry["threads"] == torch.get_num_threads() and entry["torch"] == torch.__version__


def test_a_verdict_timed_on_a_busy_machine_old_or_marginal_is_timed_again(probes_on, monkeypatch):
    """issue 54 row 16: a bfloat16 probe timed 0.97x while other jobs ran was reused for good; now each verdict
    records the load, and one taken on a busy machine, an old one, a marginal one a day old and one of an older
    cache without a load are timed again; imagegen-bench mode=probes shows them with the reason and clears them."""
    from commands import call

    threads = torch.get_num_threads()
    monkeypatch.setattr(probe, "load_now", lambda: threads + 2.0)          # two other cores' worth of work
    probe.decide("busy", Timer(10.0, 10.3))
    entries = json.loads(probes_on.read_text())["entries"]
    assert next(iter(entries.values()))["load"] == threads + 2.0
    forget()
    timer = Timer(10.0, 5.0)
    assert probe.decide("busy", timer).source == "cached" and timer.calls == 0    # still busy: as good as any
    forget()
    monkeypatch.setattr(probe, "load_now", lambda: float(threads))          # idle now: timed again
    again = probe.decide("busy", timer)
    assert again.source == "measured" and again.chosen and timer.calls == 1
    forget()
    assert probe.decide("busy", timer).source == "cached" and timer.calls == 1   # an idle verdict is trusted
    def stamp(days_ago):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - days_ago * 86400))

    fresh = {"baseline_ms": 10.0, "candidate_ms": 5.0, "threads": 1, "margin": 1.15, "load": 1.0, "when": stamp(0)}
    marginal = {**fresh, "baseline_ms": 11.6, "candidate_ms": 10.0}
    assert probe.stale(fresh, load=0.0) is None and probe.stale(marginal, load=0.0) is None
    assert "days old" in probe.stale({**fresh, "when": stamp(40)}, load=0.0)
    assert "marginal (1.16x against the 1.15x asked)" in probe.stale({**marginal, "when": stamp(2)}, load=0.0)
    assert "not recorded" in probe.stale({k: v for k, v in fresh.items() if k != "load"}, load=0.0)
    assert "other processes used 2.5 cores" in probe.stale({**fresh, "load": 3.5}, load=0.0)
    assert probe.stale({**fresh, "load": 3.5}, load=3.0) is None
    data = json.loads(probes_on.read_text())
    (entry,) = data["entries"].values()
    entry["when"] = stamp(40)
    probes_on.write_text(json.dumps(data))
    shown = call("imagegen-bench", "mode=probes", "threads=1")
    assert shown.returncode == 0 and "busy: 2.00x, chosen" in shown.stdout
    assert "timed again when next needed: it is 40 days old" in shown.stdout
    assert call("imagegen-bench", "mode=probes", "probes.clear=true", "threads=1").returncode == 0
    assert not probes_on.exists() and "no cached probe verdicts" in call("imagegen-bench", "mode=probes").stdout


def test_cache_is_timed_again_for_another_torch_or_thread_count(probes_on, monkeypatch):
    probe.decide("x", Timer(10.0, 5.0))
    forget()
    with monkeypatch.context() as m:
        m.setattr(torch, "__version__", "0.0.0-other")
        timer = Timer(5.0, 10.0)
        assert not probe.decide("x", timer).chosen and timer.calls == 1
    forget()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        timer = Timer(5.0, 10.0)
        assert not probe.decide("x", timer).chosen and timer.calls == 1
    finally:
        torch.set_num_threads(threads)
    forget()
    assert probe.decide("x", Timer(5.0, 10.0)).chosen     # the first verdict, still there for its key
    assert len(json.loads(probes_on.read_text())["entries"]) == 3


@pytest.mark.parametrize("damage", ["{not json", json.dumps({"version": 99, "entries": {}}),
                                    json.dumps({"version": 1, "entries": []}), "directory"])
def test_damaged_or_unreadable_cache_is_ignored_with_a_line(probes_on, capsys, damage):
    probes_on.parent.mkdir(parents=True)
    if damage == "directory":
        probes_on.mkdir()                                  # unreadable as a file (root reads anything else)
    else:
        probes_on.write_text(damage)
    timer = Timer(10.0, 5.0)
    assert probe.decide("x", timer).chosen and timer.calls == 1
    err = capsys.readouterr().err
    assert f"ignoring the probe cache {probes_on}" in err
    if damage != "directory":                              # rewritten whole
        assert len(json.loads(probes_on.read_text())["entries"]) == 1
    else:
        assert "could not write the probe cache" in err


def test_a_cache_entry_with_bad_timings_is_timed_again(probes_on):
    key = f"{probe.machine_key()}/x"
    probes_on.parent.mkdir(parents=True)
    probes_on.write_text(json.dumps({"version": 1, "entries": {key: {"baseline_ms": "fast", "candidate_ms": 0}}}))
    timer = Timer(10.0, 5.0)
    assert probe.decide("x", timer).chosen and timer.calls == 1


@pytest.mark.parametrize("value", ["0", "off"])
def test_probes_off_fall_back_to_the_rules(probes_on, monkeypatch, value):
    monkeypatch.setenv("IMAGEGEN_PROBE", value)
    timer = Timer(10.0, 5.0)
    assert probe.decide("x", timer) is None and timer.calls == 0 and not probes_on.exists()
    for report, fast in (({"amx": False, "avx512_bf16": True}, True), ({"amx": False, "avx512_bf16": False}, False)):
        monkeypatch.setattr(machine, "cpu_bf16_report", lambda report=report: report)
        assert precision.decide_bf16("auto", CPU, dims=(16, 32)).value is fast
        assert "measured" not in precision.decide_bf16("auto", CPU, dims=(16, 32)).reason
        assert precision.decide_precision("auto", CPU, dims=(16, 32), batch=4).value == (
            torch.bfloat16 if fast else torch.float32)


@pytest.mark.parametrize("bf16_ms, picks", [(5.0, torch.bfloat16), (20.0, torch.float32), (9.5, torch.float32)])
def test_auto_precision_by_measurement(probes_on, monkeypatch, bf16_ms, picks):
    # the flags say fast, the measurement decides
    monkeypatch.setattr(machine, "cpu_bf16_report", lambda: {"amx": True, "avx512_bf16": True})
    monkeypatch.setattr(probe, "best_ms", lambda *a, **k: (10.0, bf16_ms))
    assert precision.decide_bf16("auto", CPU, dims=(16, 32)).value is (picks == torch.bfloat16)
    header = precision.decide_bf16("auto", CPU, dims=(16, 32)).reason
    assert header.startswith("bfloat16 autocast" if picks == torch.bfloat16 else "float32")
    assert f"measured {10.0 / bf16_ms:.2f}x float32's speed" in header and str(probes_on) in header
    assert precision.decide_precision("auto", CPU, dims=(16, 32), batch=8).value == picks
    assert f"{10.0 / bf16_ms:.2f}x" in precision.decide_precision("auto", CPU, dims=(16, 32), batch=8).reason
    assert precision.decide_precision("float32", CPU, dims=(16, 32), batch=8).reason == ""
    assert precision.decide_bf16(False, CPU, dims=(16, 32)).value is False        # explicit settings are never timed
    names = {k.split("/", 1)[1] for k in json.loads(probes_on.read_text())["entries"]}
    # and the float32 side of the decoding probe asked whether to prepack each of its four products
    assert names == {"bf16-train:D16:F32", "bf16-decode:N8:D16:F32", "f32-pack:N8:I16:O48", "f32-pack:N8:I16:O16",
                     "f32-pack:N8:I16:O32", "f32-pack:N8:I32:O16"}


def test_real_precision_probes_time_the_products(probes_on):
    # no mock: the measuring code runs (small shapes) and leaves the global random state alone
    state = torch.random.get_rng_state()
    for measure in (precision.train_products(16, 32), precision.train_products(16, 32, backward=False),
                    precision.decode_products(2, 16, 32), precision.decode_products(8, 16, 32)):
        baseline, candidate = measure()
        assert 0 < baseline < 1e4 and 0 < candidate < 1e5
    assert torch.equal(state, torch.random.get_rng_state())


def kernel_or_skip():
    if ops.kernel_error("cpu") is not None:
        skip_without_cpu_kernel("the CPU kernel is not built here")


@pytest.mark.parametrize("kernel_ms, impl", [(5.0, "kernel"), (30.0, "chunked"), (9.0, "chunked")])
def test_auto_impl_by_measurement(probes_on, monkeypatch, kernel_ms, impl):
    kernel_or_skip()
    calls = []
    monkeypatch.setattr(dispatch, "time_impls", lambda *args: calls.append(args) or (10.0, kernel_ms))
    q = torch.randn(2, 2, 100, 8, requires_grad=True)
    assert ops.decide_impl(q, q, fused=True).value == impl
    assert ops.decide_impl(q, q, fused=True).value == impl and len(calls) == 1      # decided once
    assert calls[0] == (128, 8, 8, torch.float32, True, True)                 # L 100 -> probed at 128
    forget()
    monkeypatch.setattr(dispatch, "time_impls", lambda *args: (10.0, 100.0 / kernel_ms))   # the opposite, if timed
    assert ops.decide_impl(q, q, fused=True).value == impl                          # read from the cache
    line = ops.auto_impl_line({"attention": "linear", "attention_options": {"impl": "auto"}, "d_model": 16,
                               "n_heads": 2}, 100, CPU)
    assert f"impl=auto: {impl}" in line and f"{10.0 / kernel_ms:.2f}x chunked's speed" in line
    assert ops.auto_impl_line({"attention": "softmax", "d_model": 16, "n_heads": 2}, 100, CPU) is None


def test_auto_impl_rule_when_probes_are_off(probes_on, monkeypatch):
    kernel_or_skip()
    monkeypatch.setenv("IMAGEGEN_PROBE", "0")
    monkeypatch.setattr(dispatch, "time_impls", lambda *args: pytest.fail("timed with probes off"))
    q = torch.randn(1, 1, 8, 256, requires_grad=True)
    assert ops.decide_impl(q, q).value == "chunked"                 # the rule: training at E > 193
    assert ops.decide_impl(q.detach(), q.detach()).value == "kernel"
    assert "by rule" in ops.auto_impl_line({"attention": "linear", "d_model": 256, "n_heads": 1}, 8, CPU)


def test_real_impl_probe_times_both(probes_on):
    kernel_or_skip()
    state = torch.random.get_rng_state()
    for fused in (True, False):
        for grad in (True, False):
            chunked, kernel = dispatch.time_impls(64, 8, 8, torch.float32, fused, grad)
            assert chunked > 0 and kernel > 0
    assert torch.equal(state, torch.random.get_rng_state())


@pytest.mark.parametrize("packed_ms, packs", [(5.0, True), (9.5, False), (20.0, False)])
def test_float32_decoding_weights_prepacked_by_measurement(probes_on, monkeypatch, packed_ms, packs):
    """layout.pack prepacks a float32 weight only where the probe measures oneDNN's prepacked product
    faster than addmm by the margin, and only from PACK_MIN_ROWS rows; the packed product equals addmm's."""
    if not layers.can_pack(torch.float32):
        pytest.skip("this torch has no oneDNN linear")
    monkeypatch.setattr(probe, "best_ms", lambda *a, **k: (10.0, packed_ms))
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(64, 96, generator=g), torch.randn(96, generator=g)
    assert not layers.pack(w, layers.PACK_MIN_ROWS - 1).is_mkldnn        # too few rows: never prepacked
    packed = layers.pack(w, 8)
    assert packed.is_mkldnn is packs and (packed is w) is not packs
    x = torch.randn(8, 64, generator=g)
    torch.testing.assert_close(dense(x, (packed, b)), torch.addmm(b, x, w), rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("IMAGEGEN_PROBE", "0")
    monkeypatch.setattr(probe, "_verdicts", {})
    assert layers.pack(w, 8) is w                                            # probes off: addmm, as before


@pytest.mark.parametrize("panels_ms, takes", [(5.0, True), (9.5, False), (20.0, False)])
def test_float32_decoding_weights_in_panels_by_measurement(probes_on, monkeypatch, panels_ms, takes):
    """Below PACK_MIN_ROWS rows layout.pack lays a float32 weight out in the C++ kernel's panels only
    where the probe measures its product faster than addmm by the margin, and only when the output
    width is a multiple of the panel width; panel p holds columns p*P .. p*P+P-1, row after row."""
    if layers.panel_width() is None:
        skip_without_cpu_kernel("the CPU kernel is unavailable")
    P = layers.panel_width()
    monkeypatch.setattr(probe, "best_ms", lambda *a, **k: (10.0, panels_ms))
    g = torch.Generator().manual_seed(0)
    w, b, x = torch.randn(48, 2 * P, generator=g), torch.randn(2 * P, generator=g), torch.randn(3, 48, generator=g)
    panels = layers.panels(w)
    assert panels.shape == (2, 48, P) and panels[1, 5].equal(w[5, P:])
    torch.testing.assert_close(dense(x, (panels, b)), torch.addmm(b, x, w), rtol=1e-5, atol=1e-5)
    laid_out = layers.pack(w, layers.PACK_MIN_ROWS - 1)
    assert laid_out.equal(panels) if takes else laid_out is w
    odd = torch.randn(48, P + 8, generator=g)
    assert layers.pack(odd, 2) is odd                                     # not whole panels: addmm
    monkeypatch.setenv("IMAGEGEN_PROBE", "0")
    monkeypatch.setattr(probe, "_verdicts", {})
    assert layers.pack(w, 2) is w                                         # probes off: addmm, as before


@pytest.mark.parametrize("batch, chooser", [(8, "packs_float32"), (3, "takes_panels")])
def test_float32_decoding_with_laid_out_weights_equals_plain(probes_on, monkeypatch, batch, chooser):
    """A float32 decoding state with every product laid out by `pack` (prepacked for oneDNN at 8 rows,
    in the C++ kernel's panels at 3; the probe says faster) steps to the same parameters as the plain
    one, through the one-call C++ step and through the module loop."""
    from fixtures import decode_params, scaled_model
    if chooser == "packs_float32" and not layers.can_pack(torch.float32):
        pytest.skip("this torch has no oneDNN linear")
    if chooser == "takes_panels" and layers.panel_width() is None:
        skip_without_cpu_kernel("the CPU kernel is unavailable")
    model = scaled_model("linear", length=60)
    x = torch.randint(0, 256, (batch, model.length), generator=torch.Generator().manual_seed(4))
    monkeypatch.setattr(layers, chooser, lambda *shape: False)
    plain, state = decode_params(model, x, torch.float32)
    assert state.layers[0].attn.qkv[0] is model.blocks[0].attn.qkv.weight
    monkeypatch.setattr(layers, chooser, lambda *shape: True)
    for whole_model_kernel in (True, False):
        laid_out, state = decode_params(model, x, torch.float32, whole_model_kernel)
        assert layers.is_packed(state.layers[0].attn.qkv[0]) and layers.is_packed(state.layers[0].ff[1][0])
        torch.testing.assert_close(laid_out, plain, rtol=1e-4, atol=1e-4)
