"""Causal linear attention ops: every implementation against the quadratic reference
(outputs and gradients), the compiled kernel under gradcheck, the normalised attention
against a direct formula, the fallbacks, and the error messages.

Shapes: q, k (N, H, L, E), v (N, H, L, M). The CPU kernel is built on first use (about a
minute, then cached); tests that need it skip with the build error when it cannot be had.
"""
import warnings
import weakref

import pytest
import torch

from imagegen import ops
from imagegen.ops import build as kernel_mod, decode as decode_mod, kernel as kernels
from imagegen.ops.causal_linear import causal_product_reference, linear_attention_reference, mapped_attention_reference
from fixtures import SHAPES, assert_close_all, make_qkv, make_raw_qkv, out_and_grads, skip_without_cpu_kernel

CPU_IMPLS = ["cumsum", "chunked", "kernel", "auto"]


@pytest.fixture(scope="module")
def cpu_kernel():
    why = kernel_mod.kernel_error("cpu")
    if why is not None:
        skip_without_cpu_kernel(f"CPU kernel unavailable: {why}")


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 100, 1000])
def test_chunked_any_chunk_size(chunk_size):
    q, k, v = make_qkv(2, 2, 65, 4, 6)
    got = out_and_grads(lambda *t: ops.causal_product(*t, impl="chunked", chunk_size=chunk_size), q, k, v)
    assert_close_all(got, out_and_grads(causal_product_reference, q, k, v), rtol=1e-10, atol=1e-10)


def test_default_chunk_size_follows_head_dim():
    sizes = {E: ops.default_chunk_size(torch.empty(1, 1, 1, E)) for E in (1, 16, 32, 33, 64, 128, 256)}
    assert sizes == {1: 32, 16: 32, 32: 32, 33: 64, 64: 64, 128: 128, 256: 128}
    with pytest.raises(ValueError, match="chunk_size"):
        ops.causal_product(*make_qkv(1, 1, 4, 2, 2), impl="chunked", chunk_size=0)


def test_auto_rule_on_cpu(cpu_kernel):
    q, _, v = make_qkv(1, 1, 4, 256, 257)
    assert ops.decide_impl(q, v).value == "kernel"                        # no grad needed: kernel
    assert ops.decide_impl(q.requires_grad_(), v).value == "chunked"     # training at E, M > 193
    q, _, v = make_qkv(1, 1, 4, 32, 33)
    assert ops.decide_impl(q.requires_grad_(), v).value == "kernel"


def test_kernel_gradcheck(cpu_kernel):
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 6, 3, 4))
    assert torch.autograd.gradcheck(kernels.causal_product_kernel, (q, k, v))


@pytest.mark.parametrize("L, M", [(300, 33), (133, 32)])
def test_kernel_float32_close_to_float64(L, M, cpu_kernel):
    """float32 against the float64 reference; M = E = 32 runs the sweeps' copy compiled for that size
    (forward, and the backward's two sweeps), L = 133 ends on a partial group of steps."""
    q, k, v = make_qkv(2, 2, L, 32, M)
    got = out_and_grads(lambda *t: ops.causal_product(*t, impl="kernel"), *(t.float() for t in (q, k, v)))
    assert got[0].dtype == torch.float32
    assert_close_all(got, out_and_grads(causal_product_reference, q, k, v), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("impl", ["chunked", "kernel"])
def test_non_contiguous_inputs(impl, request):
    if impl == "kernel":
        request.getfixturevalue("cpu_kernel")
    q, k, v = make_qkv(2, 19, 3, 5, 6)                       # (N, L, H, D) storage
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))         # (N, H, L, D) views
    assert not q.is_contiguous()
    got = out_and_grads(lambda *t: ops.causal_product(*t, impl=impl), q, k, v)
    assert_close_all(got, out_and_grads(causal_product_reference, q, k, v), rtol=1e-10, atol=1e-10)


def test_only_some_inputs_need_grad(cpu_kernel):
    q, k, v = make_qkv(1, 2, 10, 3, 4)
    v.requires_grad_()
    out = ops.causal_product(q, k, v, impl="kernel")
    (gv,) = torch.autograd.grad(out.sum(), v)
    (gv_ref,) = torch.autograd.grad(causal_product_reference(q, k, v).sum(), v)
    torch.testing.assert_close(gv, gv_ref)


@pytest.mark.parametrize("impl", ["reference", "chunked", "kernel", "auto"])
def test_causal_linear_attention_matches_direct_formula(impl, request):
    if impl == "kernel":
        request.getfixturevalue("cpu_kernel")
    N, H, L, E, M = 2, 2, 23, 4, 5
    x = make_qkv(N, H, L, E, M)
    q, k = (torch.nn.functional.elu(t - 0.5) + 1 for t in x[:2])  # phi(x) = elu(x) + 1
    v = x[2]
    out = ops.causal_linear_attention(q, k, v, impl=impl)
    want = torch.empty(N, H, L, M, dtype=torch.float64)
    for i in range(L):  # out_i = sum_{j<=i} (q_i . k_j) v_j / (sum_{j<=i} q_i . k_j + eps)
        w = torch.einsum("nhe,nhje->nhj", q[:, :, i], k[:, :, : i + 1])
        want[:, :, i] = torch.einsum("nhj,nhjm->nhm", w, v[:, :, : i + 1]) / (w.sum(-1, keepdim=True) + ops.EPS)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", ["kernel", "chunked"])
def test_cpu_bfloat16_numerator_and_half_fallback(impl, request):
    """bfloat16 runs on the CPU kernel (computed in float32) and the chunked form; float16 has
    no CPU kernel, so auto falls back to chunked."""
    if impl == "kernel":
        request.getfixturevalue("cpu_kernel")
    q, k, v = make_qkv(1, 2, 20, 4, 4)
    got = out_and_grads(lambda *t: ops.causal_product(*t, impl=impl), *(t.bfloat16() for t in (q, k, v)))
    assert all(t.dtype == torch.bfloat16 for t in got)
    assert_close_all(got, out_and_grads(causal_product_reference, q, k, v), rtol=0.05, atol=0.1)
    assert ops.decide_impl(q.half(), v.half()).value == "chunked"


@pytest.mark.parametrize("impl", ["chunked", "auto"])
def test_linear_attention_is_float32_under_autocast_and_for_bf16_inputs(impl):
    """Autocast must not run the running sums in bfloat16: float32 inputs give the same
    result with autocast on or off, and bfloat16 inputs give the float32 result rounded."""
    q, k, v = (t.float() for t in make_qkv(2, 2, 40, 8, 8))
    want = ops.linear_attention(q, k, v, impl=impl)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = ops.linear_attention(q, k, v, impl=impl)
        low = ops.linear_attention(*(t.bfloat16() for t in (q, k, v)), impl=impl)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    exact = ops.linear_attention(*(t.bfloat16().float() for t in (q, k, v)), impl=impl)
    assert low.dtype == torch.bfloat16 and torch.equal(low, exact.bfloat16())


def test_kernel_rejects_unsupported_dtype_with_advice():
    q, k, v = (t.half() for t in make_qkv(1, 1, 4, 2, 2))
    with pytest.raises(ValueError, match=r"(?s)float32.*impl='chunked'"):
        ops.causal_product(q, k, v, impl="kernel")


def test_unavailable_kernel_raises_for_kernel_and_warns_once_for_auto(monkeypatch):
    reason = "building the cpu extension failed: no compiler here"
    monkeypatch.setattr(kernel_mod, "_modules", {"cpu": reason})
    monkeypatch.setattr(kernel_mod, "_warned", set())
    q, k, v = make_qkv(1, 1, 8, 2, 3)
    with pytest.raises(ValueError, match=r"no compiler here.*impl='chunked'"):
        ops.causal_product(q, k, v, impl="kernel")
    with pytest.warns(RuntimeWarning, match="no compiler here.*chunked") as record:
        out = ops.causal_product(q, k, v, impl="auto")
        ops.causal_product(q, k, v, impl="auto")
    assert len(record) == 1
    torch.testing.assert_close(out, causal_product_reference(q, k, v))


def test_unavailable_kernel_keeps_no_caller_alive(monkeypatch):
    """Each refusal is a new exception: a kept one, raised again, would collect every caller's frames
    in its traceback (in training, the DDP wrapper and through it the process group, past teardown)."""
    monkeypatch.setattr(kernel_mod, "_modules", {"cpu": "no compiler here"})

    class Held:
        pass

    def caller():
        held = Held()   # noqa: F841 (a local the caller's frame holds)
        with pytest.raises(kernel_mod.KernelUnavailable):
            kernel_mod.load_kernel("cpu")
        return weakref.ref(held)

    assert caller()() is None


def test_disabled_kernel_says_why(monkeypatch):
    monkeypatch.setenv("IMAGEGEN_DISABLE_KERNEL", "1")
    monkeypatch.setattr(kernel_mod, "_modules", {})
    monkeypatch.setattr(kernel_mod, "_warned", set())
    assert "IMAGEGEN_DISABLE_KERNEL" in kernel_mod.kernel_error("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ops.decide_impl(*make_qkv(1, 1, 4, 2, 2)[::2]).value == "chunked"


@pytest.mark.parametrize("shapes, match", [
    (((2, 5, 3), (2, 5, 3), (2, 5, 3)), "4-d"),
    (((1, 2, 5, 3), (1, 2, 5, 4), (1, 2, 5, 3)), "q and k must have the same shape"),
    (((1, 2, 5, 3), (1, 2, 5, 3), (1, 2, 6, 3)), "v must share"),
])
def test_bad_shapes_raise_value_error(shapes, match):
    q, k, v = (torch.rand(s) for s in shapes)
    for impl in ["reference", "chunked", "kernel", "auto"]:
        with pytest.raises(ValueError, match=match):
            ops.causal_product(q, k, v, impl=impl)


def test_mixed_dtypes_and_unknown_impl_raise_value_error():
    q, k, v = make_qkv(1, 1, 4, 2, 2)
    with pytest.raises(ValueError, match="dtype"):
        ops.causal_product(q, k, v.float())
    with pytest.raises(ValueError, match=r"unknown causal product impl 'fast'.*reference.*chunked.*kernel.*auto"):
        ops.causal_product(q, k, v, impl="fast")


# ---- the model's attention: phi applied inside (fused on the CPU) -------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("impl", CPU_IMPLS)
@pytest.mark.parametrize("op", ["causal_product", "linear_attention", "mapped_linear_attention"])
def test_impl_matches_reference_float64(op, impl, shape, request):
    """The numerator on feature-mapped q, k, the model's attention on raw q, k, and the attention on
    another map's features (the fused CPU kernel with phi the identity)."""
    if impl == "kernel":
        request.getfixturevalue("cpu_kernel")
    make, reference = {"causal_product": (make_qkv, causal_product_reference),
                       "linear_attention": (make_raw_qkv, linear_attention_reference),
                       "mapped_linear_attention": (make_qkv, mapped_attention_reference)}[op]
    q, k, v = make(*shape)
    got = out_and_grads(lambda *t: getattr(ops, op)(*t, impl=impl), q, k, v)
    assert_close_all(got, out_and_grads(reference, q, k, v), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("N, H, L", [(1, 1, 1), (1, 1, 5), (2, 3, 133), (3, 1, 64)])
@pytest.mark.parametrize("layout", ["contiguous", "packed"])
def test_fused_kernel_head_dim_32_matches_reference_float64(N, H, L, layout, cpu_kernel):
    """E = M = 32 runs the kernel's copy compiled for that size (every preset's head): outputs and
    gradients against the reference in float64, lengths not a multiple of the sweeps' steps or row
    blocks, on separate tensors and on views of one projection (N, L, 3, H, E)."""
    E = 32
    if layout == "packed":
        qkv = torch.randn(N, L, 3, H, E, dtype=torch.float64) * 2
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        assert q.stride(2) == 3 * H * E
    else:
        q, k, v = make_raw_qkv(N, H, L, E, E)
    got = out_and_grads(lambda *t: ops.linear_attention(*t, impl="kernel"), q, k, v)
    assert_close_all(got, out_and_grads(linear_attention_reference, q, k, v), rtol=1e-9, atol=1e-10)


def test_fused_kernel_gradients_are_laid_out_as_their_inputs(cpu_kernel):
    """Contiguous q, k, v get contiguous gradients (written head by head), views of one projection
    heads-last ones; both equal the reference's."""
    separate = tuple(t.requires_grad_() for t in make_raw_qkv(2, 3, 40, 32, 32))
    qkv = torch.randn(2, 40, 3, 3, 32, dtype=torch.float64, requires_grad=True)
    for inputs in (separate, qkv.permute(2, 0, 3, 1, 4).unbind(0)):
        g = torch.randn(inputs[2].shape, dtype=torch.float64)
        got = torch.autograd.grad(ops.linear_attention(*inputs, impl="kernel"), inputs, g)
        want = torch.autograd.grad(linear_attention_reference(*inputs), inputs, g)
        for a, b, x in zip(got, want, inputs):
            assert a.is_contiguous() == x.is_contiguous()
            assert a.is_contiguous() or a.transpose(1, 2).is_contiguous()
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_fused_kernel_gradcheck(cpu_kernel):
    q, k, v = (t.requires_grad_() for t in make_raw_qkv(1, 2, 7, 3, 4))
    assert torch.autograd.gradcheck(lambda *t: kernels.linear_attention_kernel(*t, eps=1e-6), (q, k, v))
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 7, 3, 4))
    q.data[0, 0, 2] *= -1                        # features of any sign (rff's), the denominator still away from 0
    assert torch.autograd.gradcheck(lambda *t: kernels.linear_attention_kernel(*t, eps=1e-6, mapped=True), (q, k, v))


@pytest.mark.parametrize("F, M", [(32, 32), (64, 32), (5, 7)])
@pytest.mark.parametrize("layout", ["contiguous", "views"])
def test_fused_kernel_mapped_matches_reference_float64(F, M, layout, cpu_kernel):
    """Features of another map through the fused kernel (phi the identity; F = M = 32 runs the copy
    compiled for that size), contiguous and as strided views, lengths off the sweeps' steps: outputs
    and gradients against the quadratic reference in float64, and against the numerator kernel's
    form ([v, 1] through causal_product, then a division), which mapped attention ran before."""
    q, k, v = make_qkv(2, 3, 133, F, M)
    q[0, 1, :40] *= -0.5                         # some negative features, as rff's
    if layout == "views":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        assert not q.is_contiguous() and q.stride(-1) == 1
    got = out_and_grads(lambda *t: ops.mapped_linear_attention(*t, impl="kernel"), q, k, v)
    assert_close_all(got, out_and_grads(mapped_attention_reference, q, k, v), rtol=1e-9, atol=1e-10)
    numerator = out_and_grads(lambda *t: ops.causal_linear_attention(*t, impl="kernel"), q, k, v)
    assert_close_all(got, numerator, rtol=1e-9, atol=1e-10)


def test_fused_kernel_mapped_decoding_continues_the_sequence(cpu_kernel):
    """The mapped kernel's state (attention_state, F x M): positions one at a time equal the whole
    sequence, in float64 and for bfloat16 inputs (summed in float32)."""
    module = kernel_mod.load_kernel("cpu")
    for dtype, tol in ((torch.float64, 1e-12), (torch.bfloat16, 1e-2)):
        q, k, v = (t.to(dtype) for t in make_qkv(2, 3, 20, 6, 5))
        whole = module.attention_forward(q, k, v, 1e-6, mapped=True)[0]
        state = module.attention_state(q, 6, 6, 5)
        steps = [module.attention_forward(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], 1e-6, state,
                                          mapped=True)[0] for t in range(20)]
        torch.testing.assert_close(torch.cat(steps, 2).double(), whole.double(), rtol=tol, atol=tol)


def test_fused_kernel_reads_views_of_one_projection_and_writes_heads_last(cpu_kernel):
    N, L, H, E = 2, 37, 3, 5
    qkv = torch.randn(N, L, 3 * H * E, dtype=torch.float64) * 2      # as the model's projection
    q, k, v = (t.view(N, L, H, E).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
    assert q.stride(-1) == 1 and not q.is_contiguous()
    got = out_and_grads(lambda *t: ops.linear_attention(*t, impl="kernel"), q, k, v)
    assert_close_all(got, out_and_grads(linear_attention_reference, q, k, v), rtol=1e-9, atol=1e-10)
    assert ops.linear_attention(q, k, v, impl="kernel").transpose(1, 2).is_contiguous()  # merge is a view


@pytest.mark.parametrize("impl", ["kernel", "chunked", "auto"])
def test_linear_attention_qkv_is_split_attention_merged(impl, request):
    """The packed form (the fused kernel takes the projection whole and returns its gradient as
    one tensor) against the reference on the split heads, outputs and gradients in float64."""
    if impl == "kernel":
        request.getfixturevalue("cpu_kernel")
    N, L, H, E = 2, 37, 3, 5
    qkv = (torch.randn(N, L, 3 * H * E, dtype=torch.float64) * 2).requires_grad_()

    def split_reference(x):
        q, k, v = (t.view(N, L, H, E).transpose(1, 2) for t in x.chunk(3, dim=-1))
        return linear_attention_reference(q, k, v).transpose(1, 2).reshape(N, L, H * E)

    g = torch.randn(N, L, H * E, dtype=torch.float64)
    got = ops.linear_attention_qkv(qkv, H, impl=impl)
    want = split_reference(qkv)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(*(torch.autograd.grad(o, qkv, g)[0] for o in (got, want)), rtol=1e-9, atol=1e-10)


def test_fused_kernel_packed_gradcheck(cpu_kernel):
    qkv = (torch.randn(2, 6, 3, 2, 3, dtype=torch.float64) * 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: kernels.linear_attention_kernel(x, eps=1e-6), (qkv,))


@pytest.mark.parametrize("mapped", [False, True])
def test_fused_kernel_bfloat16_is_float32_on_the_same_values(mapped, cpu_kernel):
    """bfloat16 q, k, v are widened as read and summed in float32: the output is the float32
    kernel's on the same values, rounded; the gradients differ only through that rounding of
    the output, which the backward reads (well within bfloat16's 2^-8). Raw q, k, and features."""
    op = ops.mapped_linear_attention if mapped else ops.linear_attention
    q, k, v = (t.bfloat16() for t in (make_qkv if mapped else make_raw_qkv)(2, 3, 200, 32, 32))
    low = out_and_grads(lambda *t: op(*t, impl="kernel"), q, k, v)
    wide = out_and_grads(lambda *t: op(*t, impl="kernel"), *(t.float() for t in (q, k, v)))
    assert all(t.dtype == torch.bfloat16 for t in low)
    assert torch.equal(low[0], wide[0].bfloat16())
    for a, b in zip(low[1:], wide[1:]):
        torch.testing.assert_close(a.float(), b, rtol=1e-2, atol=1e-2 * b.abs().max().item())


def test_fused_kernel_float32_close_to_float64_with_extreme_inputs(cpu_kernel):
    q, k, v = make_raw_qkv(2, 2, 300, 32, 32)
    q[0, 0, :50] -= 95          # exp underflow side of phi: far below the float32 range of exp
    k[0, 1, 100:] += 40         # large keys
    got = out_and_grads(lambda *t: ops.linear_attention(*t, impl="kernel"), *(t.float() for t in (q, k, v)))
    assert got[0].dtype == torch.float32 and all(torch.isfinite(t).all() for t in got)
    assert_close_all(got, out_and_grads(linear_attention_reference, q, k, v), rtol=1e-4, atol=1e-4)


def test_fused_kernel_only_some_inputs_need_grad(cpu_kernel):
    q, k, v = make_raw_qkv(1, 2, 10, 3, 4)
    k.requires_grad_()
    (gk,) = torch.autograd.grad(ops.linear_attention(q, k, v, impl="kernel").sum(), k)
    (gk_ref,) = torch.autograd.grad(linear_attention_reference(q, k, v).sum(), k)
    torch.testing.assert_close(gk, gk_ref)


def test_decode_step_names_its_tensors_as_python_does(cpu_kernel):
    """The C++ decoding step's order of tensors (csrc/cpu_kernel.h, exported by the module) is the
    order of the fields of the named tuples that PixelTransformer.kernel_weights builds."""
    module = kernel_mod.load_kernel("cpu")
    assert module.decode_layer_weights == decode_mod.DecodeLayer._fields
    assert module.decode_head_weights == decode_mod.DecodeHead._fields
    with pytest.raises(RuntimeError, match=f"each layer takes {len(decode_mod.DecodeLayer._fields)} tensors"):
        layer = [torch.zeros(1)] * (len(decode_mod.DecodeLayer._fields) - 1)
        module.decode_step(torch.zeros(1, 4), [layer], [torch.zeros(1)] * 4, 2, 1e-5, 1e-6)


def test_kernel_gelu_is_torchs_exact_gelu(cpu_kernel):
    """The decoding step's GELU (csrc/gelu.h on float32: polynomials and a power of two in vectors)
    against torch's exact GELU in float64 on the same float32 values: within 3e-7 (a float32 rounding
    of outputs up to 12; the tanh form is 5e-4 off, torch's own float32 GELU 1.2e-6) on a dense grid
    over [-12, 12] and at the extremes; x for large x, 0 for very negative x, inf for inf, -0 for -inf
    (the limit), NaN for NaN. In place, rows split over threads as one row; other dtypes and strided x
    are torch's GELU."""
    gelu_ = kernel_mod.load_kernel("cpu").gelu_
    inf, nan = float("inf"), float("nan")
    tails = [1e30, -1e30, 3e38, -3e38, 6.0, -6.0, 5.55, -5.55, 5.5, -5.5, 1.4142, -1.4142, 1.4143, -1.4143]
    tiny = [-0.0, 0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1e-20, -1e-20]
    x = torch.cat([torch.linspace(-12, 12, 1_200_007), torch.tensor(tails + tiny)])   # 7: a partial last vector
    got = x.clone()
    assert gelu_(got).data_ptr() == got.data_ptr()
    want = torch.nn.functional.gelu(x.double())
    assert (got.double() - want).abs().max().item() <= 3e-7
    assert torch.equal(got[-len(tiny):].signbit(), want[-len(tiny):].signbit())      # -0 and tiny negatives
    special = gelu_(torch.tensor([inf, -inf, nan, 1e30, -1e30]))
    assert special[0] == inf and special[1] == 0 and special[2].isnan() and special[3] == 1e30 and special[4] == 0
    rows = x[:1_200_000].view(-1, 1000).clone()                                       # split over threads by rows
    assert torch.equal(gelu_(rows).flatten(), got[:1_200_000])
    for other in (x[:999].bfloat16(), x[:999].double(), x[:1000].view(10, 100).t()):
        assert torch.equal(gelu_(other.clone()), torch.nn.functional.gelu(other))
