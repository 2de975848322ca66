"""precision=int8, continued from tests/test_int8.py: the C++ kernel's own int8 product (decode_linear_int8,
csrc/int8_linear.cpp) against its reference in every form the CPU runs (vnni, avx2, portable), packing,
Dense's step form, re-quantizing after a change, and the decoding step a probe picks."""
import json

import numpy as np
import pytest
import torch

from imagegen.dtypes import INT8
from imagegen.ops import dense as dense_module
from imagegen.ops.dense import Dense, dense, int8_product, int8_weights
from imagegen.ops.int8 import can_int8, int8_reduce_range
from fixtures import decode_params, scaled_model, skip_without_cpu_kernel

CPU = torch.device("cpu")
pytestmark = [pytest.mark.skipif(can_int8() is not None, reason=f"no int8 products here: {can_int8()}"),
              pytest.mark.usefixtures("one_thread")]


# Tolerance of one int8 product, as tests/test_int8.py states it: the error's norm under 2% of the float32
# output's norm (3% where activations are quantized to 7 bits, CPUs without VNNI).
PRODUCT_REL = 0.03 if int8_reduce_range() else 0.02


@pytest.fixture(scope="module")
def int8_kernel():
    from imagegen.ops.build import kernel_error, load_kernel
    why = kernel_error("cpu")
    if why is not None:
        skip_without_cpu_kernel(f"CPU kernel unavailable: {why}")
    return load_kernel("cpu")


# the model's shapes (paper_cifar's per-layer qkv, out, ff1, ff2; the small presets') and a ragged one
# (K not a multiple of 4, O not of 64: both padded)
KERNEL_SHAPES = [(256, 768), (256, 256), (256, 1024), (1024, 256), (128, 384), (128, 512), (512, 128), (130, 70)]


def int8_case(d_in, d_out, rows):
    from imagegen.ops.int8 import pack_int8
    g = torch.Generator().manual_seed(d_in * 7 + d_out + rows)
    w = torch.randn(d_in, d_out, generator=g) * 0.05
    b = torch.randn(d_out, generator=g) * 0.1
    x = torch.randn(rows, d_in, generator=g)
    x[0, 3] = 4.0                                   # one large activation: the row's scale
    return x, w, b, pack_int8(w)


FORMS = ("vnni", "avx2", "portable")    # the int8 product: AVX512-VNNI, AVX2 (the sign trick), vector extensions


def runs_form(kernel, form):
    """Skip unless this CPU runs `form` of the kernel's int8 product."""
    if form not in kernel.decode_int8_forms():
        pytest.skip(f"this CPU does not run the int8 product's {form} form")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("d_in, d_out", KERNEL_SHAPES)
def test_int8_kernel_is_its_reference(int8_kernel, d_in, d_out, rows, form):
    """The kernel's int32 sums are exact and equal the reference's: the outputs differ only by the
    rounding of the last multiply-add, which the kernel may fuse: |got - want| <= 2^-22 (|want| + |b|).
    A sum off by one would miss that bound for |sums| under 2^22 (here they stay under 2^20)."""
    from imagegen.ops.int8 import linear_int8_reference
    runs_form(int8_kernel, form)
    x, w, b, packed = int8_case(d_in, d_out, rows)
    got = int8_kernel.decode_linear_int8(x, *packed, b, form)
    want = linear_int8_reference(x, packed, b)
    assert got.dtype == torch.float32 and got.shape == (rows, d_out)
    assert ((got - want).abs() <= 2.0 ** -22 * (want.abs() + b.abs())).all()


@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_int8_forms_sum_extreme_bytes_exactly(int8_kernel, rows):
    """Every form's int32 sums equal the exact integer product at the extremes of its bytes, where AVX2's
    vpmaddubsw would saturate its 16-bit pairs if fed the stored activations xu = xs + 128 (255 x 127 twice:
    64770): activations quantized to -127, 0 and 127 (xu 1, 128, 255) against weights -128, -127, 0, 127,
    in every pairing and in long runs of one sign. Scales of 1 and a zero bias make the outputs the sums
    themselves (under 2^24 in magnitude: exact in float32), so outputs are compared for equality."""
    from imagegen.ops.int8 import lay_out_int8
    K, O = 1024, 136                               # O: two panels and a ragged third
    g = torch.Generator().manual_seed(rows)
    levels = torch.tensor([-128, -127, 0, 127], dtype=torch.int8)
    q = levels[torch.randint(0, 4, (K, O), generator=g)]
    q[:, 0], q[:, 1], q[:, 2] = 127, -128, -127        # whole columns of one extreme
    q[: K // 2, 3], q[K // 2:, 3] = 127, -128
    xs = torch.tensor([-127.0, 0.0, 127.0])[torch.randint(0, 3, (rows, K), generator=g)]
    xs[0] = 127.0                                      # a row of 255s (xu): the largest pairs
    xs[0, :2] = -127.0
    if rows > 1:
        xs[1] = -127.0                                 # a row of 1s (xu)
    packed = (lay_out_int8(q), torch.ones(O), q.sum(0, dtype=torch.int32))
    want = (xs.double() @ q.double()).float()          # max|x| = 127 per row: sx = 1, xs = x exactly
    assert want.abs().max() > 127 * 128 * 1000         # far past int16 and vpmaddubsw's pairs
    for form in int8_kernel.decode_int8_forms():
        assert torch.equal(int8_kernel.decode_linear_int8(xs, *packed, torch.zeros(O), form), want), form


def test_int8_avx2_form_is_the_vnni_form(int8_kernel):
    """The AVX2 form, forced on a CPU with AVX512-VNNI, gives the VNNI form's outputs (the same int32 sums,
    the same float32 arithmetic after them) at the batches sampling runs."""
    runs_form(int8_kernel, "vnni")
    for rows in (1, 4, 16, 67):
        x, w, b, packed = int8_case(256, 1024, rows)
        want = int8_kernel.decode_linear_int8(x, *packed, b, "vnni")
        got = int8_kernel.decode_linear_int8(x, *packed, b, "avx2")
        assert torch.allclose(got, want, rtol=2 ** -22, atol=2 ** -22 * b.abs().max().item()), rows


def test_int8_form_asked_for_is_checked(int8_kernel):
    x, w, b, packed = int8_case(64, 64, 1)
    forms = int8_kernel.decode_int8_forms()
    assert forms[-1] == "portable" and int8_kernel.decode_int8_form() == forms[0]   # auto: the best, unless forced
    with pytest.raises(RuntimeError, match="must be vnni, avx2 or portable"):
        int8_kernel.decode_linear_int8(x, *packed, b, "sse2")


@pytest.mark.parametrize("rows", [1, 4, 5])
@pytest.mark.parametrize("d_in, d_out", KERNEL_SHAPES)
def test_int8_kernel_tracks_float32(int8_kernel, d_in, d_out, rows):
    """Within the bound of 8-bit rounding, per output: x = xq + dx, w = wq + dw with |dx| <= sx / 2
    (sx = max|x_row| / 127) and |dw| <= scale / 2, so |x w - xq wq| <= sx / 2 sum_k |w_k| +
    scale / 2 sum_k |xq_k| (plus float32 rounding: 1e-5 of the output's scale); and the error's norm
    under PRODUCT_REL (2%) of the float32 output's."""
    from imagegen.ops.int8 import quantize_rows
    x, w, b, packed = int8_case(d_in, d_out, rows)
    got = int8_kernel.decode_linear_int8(x, *packed, b)
    want = (x.double() @ w.double() + b.double())
    xs, sx = quantize_rows(x)
    xq = xs.double() * sx.double()[:, None]
    bound = (sx.double()[:, None] / 2 * w.double().abs().sum(0)
             + packed[1].double() / 2 * xq.abs().sum(1, keepdim=True))
    err = (got.double() - want).abs()
    assert (err <= 1.001 * bound + 1e-5 * want.abs().max()).all()
    assert err.norm() < PRODUCT_REL * want.norm() and err.max() > 0


def test_pack_int8_rounds_each_column_and_lays_it_out(int8_kernel):
    from imagegen.ops.int8 import INT8_GROUP, INT8_PANEL, pack_int8, unpack_int8
    w = torch.randn(130, 70)
    Wq, scales, colsums = pack_int8(w)
    assert Wq.dtype == torch.int8 and Wq.shape == (2, 33, INT8_PANEL, INT8_GROUP) and Wq.is_contiguous()
    torch.testing.assert_close(scales, w.abs().amax(0) / 127)
    q = unpack_int8((Wq, scales, colsums), 130)
    assert torch.equal(q, torch.round(w / scales).clamp(-127, 127).to(torch.int8))
    assert q.abs().amax(0).eq(127).all() and torch.equal(colsums, q.sum(0, dtype=torch.int32))
    assert Wq.sum(dtype=torch.int64) == q.sum(dtype=torch.int64)        # the padding is zero
    assert Wq[0, 0, 1, 2] == q[2, 1] and Wq[1, 32, 5, 1] == q[129, 69]


def test_int8_kernel_zero_rows_and_bad_packing(int8_kernel):
    from imagegen.ops.int8 import pack_int8
    w, b = torch.randn(64, 128), torch.randn(128)
    packed = pack_int8(w)
    x = torch.zeros(2, 64)
    x[1] = torch.randn(64)
    got = int8_kernel.decode_linear_int8(x, *packed, b)
    assert torch.equal(got[0], b)                                         # a zero row: the bias
    assert int8_kernel.decode_linear_int8(torch.zeros(0, 64), *packed, b).shape == (0, 128)
    with pytest.raises(RuntimeError, match="pack_int8|must match"):
        int8_kernel.decode_linear_int8(torch.randn(1, 60), *packed, b)   # K = 60: 15 groups, not 16
    with pytest.raises(RuntimeError, match="pack_int8|must match"):
        int8_kernel.decode_linear_int8(torch.randn(1, 64), packed[0], packed[1], packed[2].long(), b)


@pytest.mark.parametrize("rows", [1, 4])
def test_dense_runs_the_kernels_step_form_as_its_reference(int8_kernel, rows):
    """`dense` on `step_form`'s (Wq, extra) (what Dense.cast gives decoding and int8_weights, and the one-call
    step reads) computes `linear_int8_reference`'s product."""
    from imagegen.ops.int8 import linear_int8_reference, step_form
    x, w, b, packed = int8_case(256, 768, rows)
    want = linear_int8_reference(x, packed, b)
    got = dense(x, step_form(w, b))
    assert torch.allclose(got, want, rtol=2 ** -22, atol=2 ** -22 * (want.abs().max() + b.abs().max()).item())


def test_int8_weights_are_quantized_again_after_every_change(int8_kernel):
    """Dense.cast(INT8) quantizes the parameters once and reuses that while they stay as they are; any in-place
    change (an optimizer's step, load_state_dict) or new parameters give the new weights' quantization."""
    from imagegen.ops.int8 import step_form
    layer = Dense(64, 128, std=1.0)

    def matches(got):
        want = step_form(layer.weight.detach(), layer.bias.detach())
        return all(torch.equal(a.flatten().view(torch.uint8), b.flatten().view(torch.uint8))   # bit for bit
                   for a, b in zip(got, want))
    first = layer.cast(INT8, per_row=True)
    assert layer.cast(INT8, per_row=True)[0] is first[0] and matches(first)
    layer.weight.grad, layer.bias.grad = torch.ones_like(layer.weight), torch.ones_like(layer.bias)
    torch.optim.SGD(layer.parameters(), lr=0.5).step()
    assert matches(layer.cast(INT8, per_row=True)) and not matches(first)
    layer.load_state_dict({"weight": torch.randn(64, 128), "bias": torch.randn(128)})
    assert matches(layer.cast(INT8, per_row=True))
    layer.weight = torch.nn.Parameter(torch.randn(64, 128))
    assert matches(layer.cast(INT8, per_row=True))


def test_int8_forward_quantizes_each_row_whatever_a_probe_picked(int8_kernel, monkeypatch):
    """int8_weights' forward (evaluation's precision=int8, the conversion's int8 check) takes the kernel's
    per-row product even where a probe picks fbgemm's for speed (its one activation scale per call would make
    the bits/dim depend on the batch and the thread count): each row's output is the reference's for that
    row alone. The same rows through fbgemm's product depend on their neighbours."""
    from imagegen.ops import dense as dense_mod
    from imagegen.ops.int8 import linear_int8_reference, pack_int8
    monkeypatch.setattr(dense_mod, "takes_kernel", lambda always=False: always)  # "fbgemm is faster"
    layer = Dense(64, 48, std=0.1)
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 1, 6)[:, None]
    with torch.no_grad():
        with int8_weights(layer):
            together = layer(x)
            alone = torch.cat([layer(row[None]) for row in x])
            assert int8_product(layer) == "per row"            # what the conversion's record names
        assert int8_product(layer) is None
        monkeypatch.setattr(dense_mod, "takes_kernel", lambda *args, **kw: False)     # no kernel: fbgemm's
        with int8_weights(layer):
            assert int8_product(layer) == "per call"
        fbgemm = layer.cast(INT8)
        fbgemm_together, fbgemm_alone = dense(x, fbgemm), torch.cat([dense(row[None], fbgemm) for row in x])
    want = linear_int8_reference(x, pack_int8(layer.weight.detach()), layer.bias.detach())
    assert torch.equal(together, alone)
    assert torch.allclose(together, want, rtol=2 ** -22, atol=2 ** -22 * want.abs().max().item())
    assert not torch.allclose(fbgemm_together, fbgemm_alone, rtol=1e-3, atol=0)


def test_int8_decoding_takes_the_step_a_probe_measures(int8_kernel, monkeypatch, probes_on):
    """int8 decoding runs the one-call C++ step unless a probe of whole steps (keyed by the kernel's form, the
    batch and the model's shape) finds the module loop with fbgemm's products MARGIN times faster; with probes
    off, wherever the kernel's int8 product has a vector form; inside forced_product, what it forces. Sampling's
    plan makes that choice (`sampling.plan.decoding_state`), not the model."""
    from imagegen.sampling import plan
    from imagegen.ops.int8 import forced_product, int8_form
    from imagegen.tuning import probe
    model = scaled_model("linear", length=40)
    timings = {}
    monkeypatch.setattr(plan, "time_steps", lambda m, batch: timings[batch])
    timings.update({1: (1.0, 2.0), 256: (1.0, 0.5)})        # ms: (one-call, module loop with fbgemm)
    one_call = plan.decoding_state(model, 1, CPU, INT8)
    assert one_call.kernel is not None and isinstance(one_call.layers[0].attn.qkv[0], torch.Tensor)
    loop = plan.decoding_state(model, 256, CPU, INT8)
    assert loop.kernel is None and not isinstance(loop.layers[0].attn.qkv[0], torch.Tensor)   # fbgemm's weight
    keys = sorted(k.split("/", 1)[1] for k in json.loads(probes_on.read_text())["entries"])
    assert [k for k in keys if k.startswith("int8-step")] == [f"int8-step:{int8_form()}:N{n}:D64:F128:L3:H4:C0"
                                                              for n in (1, 256)]
    with forced_product("kernel"):
        assert plan.decoding_state(model, 256, CPU, INT8).kernel is not None
    monkeypatch.setattr(plan, "time_steps", lambda m, batch: pytest.fail("the model timed its own step"))
    model.init_state(8, CPU, INT8)                       # the model holds no policy: it never probes
    monkeypatch.setenv("IMAGEGEN_PROBE", "0")
    assert probe.decide("anything", lambda: 1 / 0) is None
    assert plan.int8_one_call(model, 256) == (int8_form() in ("vnni", "avx2"))


def test_int8_form_is_an_argument_that_reaches_every_product(int8_kernel, monkeypatch):
    """forced_form(form) names the form int8_form() reports and the kernel's int8 products run: `dense` on Dense's
    step form gives decode_linear_int8's outputs in that form bit for bit (the same code), and the one-call step is
    handed it; auto is the best this CPU runs; a form it cannot run is one sentence (the kernel's calls: one
    RuntimeError naming the argument)."""
    from imagegen.errors import UserError
    from imagegen.ops import decode as decode_module
    from imagegen.ops.decode import DecodeLayer
    from imagegen.ops.int8 import forced_form, forced_product, int8_form, step_form
    forms = int8_kernel.decode_int8_forms()
    assert forms[-1] == "portable" and int8_form() == int8_kernel.decode_int8_form() == forms[0]
    x, w, b, packed = int8_case(256, 1024, 3)
    for form in [*forms, "auto"]:
        with forced_form(form):
            assert int8_form() == (forms[0] if form == "auto" else form)
            assert torch.equal(dense(x, step_form(w, b)), int8_kernel.decode_linear_int8(x, *packed, b, form))
    with pytest.raises(UserError, match="int8 form 'sse9' is not one this CPU runs; use auto or one of"):
        with forced_form("sse9"):
            pass
    for call in (lambda: int8_kernel.decode_linear(x, *step_form(w, b), "sse9"),
                 lambda: int8_kernel.decode_step(torch.zeros(1, 4), [[torch.zeros(1)] * len(DecodeLayer._fields)],
                                                 [torch.zeros(1)] * 4, 2, 1e-5, 1e-6, "elu", "sse9")):
        with pytest.raises(RuntimeError, match="_form must be vnni, avx2 or portable"):
            call()
    handed = []
    monkeypatch.setattr(decode_module, "load_kernel", lambda device: Handed(int8_kernel, handed))
    model = scaled_model("linear", length=40)
    with forced_form("portable"), forced_product("kernel"):       # the one-call step (portable alone: the loop)
        decode_params(model, torch.zeros(2, 40, dtype=torch.long), INT8, whole_model_kernel=True)
    assert handed and set(handed) == {"portable"}


class Handed:
    """The kernel module, recording the int8 form each decode_step call is handed."""
    def __init__(self, kernel, forms):
        self.kernel, self.forms = kernel, forms

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def decode_step(self, *args):
        self.forms.append(args[7])
        return self.kernel.decode_step(*args)


@pytest.mark.parametrize("bf16", [True, False], ids=["kept-bf16", "kept-float32"])
@pytest.mark.parametrize("one_call", [True, False], ids=["one-call-step", "module-loop"])
def test_int8_steps_compute_the_int8_forward(int8_kernel, one_call, bf16, monkeypatch):
    """One rule for the products int8 keeps (`Dense.int8_keeps`: the head in float32, the first block's
    feed-forward input in bfloat16 where that is faster here), read by decoding and by `int8_weights`' forward:
    in int8, stepping through a sequence (the one-call C++ step, or the module loop with the kernel's per-row
    products) gives the forward's outputs to float tolerance, so evaluation's precision=int8 scores what the
    sampler computes; and the bits/dim of those steps is the forward's."""
    from imagegen.bits_per_dim import bits_per_dim
    from imagegen.ops.int8 import forced_product
    from imagegen.precision import keep_out_of_int8
    model = scaled_model("linear", length=60)
    assert not any(m.int8_keeps for m in model.modules() if isinstance(m, Dense))   # the model holds no int8 policy
    keep_out_of_int8(model)
    monkeypatch.setattr(dense_module, "bf16_faster", lambda: bf16)                # the machine's verdict, both ways
    kept = {name: m.int8_keeps for name, m in model.named_modules() if isinstance(m, Dense) and m.int8_keeps}
    assert kept == {"blocks.0.ff.0": torch.bfloat16, "proj": torch.float32}
    x = torch.randint(0, 256, (5, model.length), generator=torch.Generator().manual_seed(2), dtype=torch.uint8)
    with forced_product("kernel"):
        steps, state = decode_params(model, x.long(), INT8, whole_model_kernel=one_call)
    assert (state.kernel is not None) == one_call
    assert state.layers[0].ff[0][0].dtype == (torch.bfloat16 if bf16 else torch.float32)
    assert state.layers[1].ff[0][0].dtype == torch.int8 and state.head[0].dtype == torch.float32
    steps = steps.transpose(0, 1)                                               # (N, L, P)
    with torch.no_grad():
        want32 = model(x)
        with int8_weights(model):
            forward = model(x)
            assert int8_product(model) == "per row"
            bpd = bits_per_dim(model, x, 2, CPU)
    assert (forward - want32).abs().max() > 1e-3                                 # int8 is not float32 here
    assert torch.allclose(steps, forward, rtol=1e-4, atol=1e-4 * forward.abs().max().item())
    stepped = -model.head.log_prob(steps, x).double().sum().item() / (x.numel() * np.log(2))
    assert stepped == pytest.approx(bpd, rel=1e-5)
