"""The csrc CUDA causal product (csrc/causal_product_cuda.cu) against the float64 reference: outputs and
gradients in float32, half precision accumulating in float32, non-contiguous inputs and the head-size limit.
Marked cuda; they skip without a CUDA GPU (.ci/gpu-check runs them on one)."""
import pytest
import torch

from imagegen import ops
from imagegen.ops import build as kernel_mod, kernel as kernels
from imagegen.ops.causal_linear import causal_product_reference
from fixtures import SHAPES, assert_close_all, make_qkv, out_and_grads

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def cuda_kernel():
    why = kernel_mod.kernel_error("cuda")
    if why is not None:
        pytest.fail(f"CUDA is visible but the CUDA kernel is unavailable: {why}")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("shape", SHAPES + [(2, 4, 1000, 32, 33), (1, 1, 37, 256, 256)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("impl", ["chunked", "kernel", "auto"])
def test_cuda_float32_matches_float64_reference(impl, shape, cuda_kernel):
    q, k, v = make_qkv(*shape)
    got = out_and_grads(lambda *t: ops.causal_product(*t, impl=impl), *(t.cuda().float() for t in (q, k, v)))
    want = out_and_grads(causal_product_reference, q, k, v)
    scale = max(1.0, want[0].abs().amax().item()) if want[0].numel() else 1.0  # sums of up to L terms (L may be 0)
    assert_close_all([t.cpu() for t in got], want, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype, rel_tol", [(torch.float16, 1e-2), (torch.bfloat16, 4e-2)])
def test_cuda_half_precision_vs_float32(dtype, rel_tol, cuda_kernel):
    """fp16/bf16 inputs accumulate in float32: max error relative to the largest |value| of
    each output (outputs and gradients) stays under rel_tol (1e-2 fp16, 4e-2 bf16)."""
    q, k, v = (t.cuda() for t in make_qkv(2, 4, 500, 32, 33, dtype=torch.float32))
    q, k, v = (t.to(dtype).float() for t in (q, k, v))  # same (rounded) inputs for both runs
    want = out_and_grads(lambda *t: ops.causal_product(*t, impl="kernel"), q, k, v)
    got = out_and_grads(lambda *t: ops.causal_product(*t, impl="kernel"), *(t.to(dtype) for t in (q, k, v)))
    for name, a, b in zip(("out", "grad_q", "grad_k", "grad_v"), got, want):
        assert a.dtype == dtype
        err = (a.float() - b).abs().max().item() / b.abs().max().item()
        assert err < rel_tol, f"{name}: relative error {err:.2e} >= {rel_tol}"


@pytest.mark.cuda
@cuda
def test_cuda_non_contiguous_and_limits(cuda_kernel):
    q, k, v = (t.cuda().float().transpose(1, 2) for t in make_qkv(2, 19, 3, 5, 6))
    got = out_and_grads(lambda *t: ops.causal_product(*t, impl="kernel"), q, k, v)
    want = out_and_grads(causal_product_reference, *(t.cpu().double() for t in (q, k, v)))
    assert_close_all([t.cpu() for t in got], want, rtol=1e-4, atol=1e-4)
    assert ops.decide_impl(q, v).value == "chunked"                      # the bare numerator: auto takes chunked
    big = make_qkv(1, 1, 4, 257, 2, dtype=torch.float32, device="cuda")
    with pytest.raises(ValueError, match="E, M <= 256"):
        ops.causal_product(*big, impl="kernel")
    assert ops.decide_impl(big[0], big[2]).value == "chunked"


@pytest.mark.cuda
@cuda
def test_cuda_gradcheck_float32_small(cuda_kernel):
    """float32 accumulation: compare the kernel's backward with the reference's on cuda."""
    q, k, v = make_qkv(1, 2, 6, 3, 4, dtype=torch.float32, device="cuda")
    got = out_and_grads(kernels.causal_product_kernel, q, k, v)
    want = out_and_grads(causal_product_reference, q, k, v)
    assert_close_all(got, want, rtol=1e-5, atol=1e-5)
