"""The Triton kernels of the model's linear attention (imagegen/ops/triton_linear.py) against
the float64 quadratic reference: outputs and gradients, the decoding step, the model's wiring,
the dispatch rule, that the kernels compile for a GPU (sm_90, compiled here without one), and
that CPU users never import triton.

Where no CUDA GPU is visible, tests/conftest.py sets TRITON_INTERPRET=1 before anything imports
triton, and the kernels run on CPU tensors in Triton's interpreter (the "interp" cases; float32
and float16, the interpreter's bfloat16 arithmetic being wrong). Where a GPU is visible the same
cases run compiled on it (the "cuda" cases, marked cuda, with bfloat16 added) and the interpreter
cases skip; `TRITON_INTERPRET=1 pytest tests/test_triton.py` runs those there too.
Skipped only when triton does not import and IMAGEGEN_CI_REQUIRE does not name triton (CI's does).
The interpreter is slow (about 0.1-1 s per call): shapes are small.
"""
import os
import subprocess
import sys
import warnings

import pytest
import torch

from imagegen import ops
from imagegen.ops import dispatch
from imagegen.attention.linear import LinearAttention
from imagegen.ops import build as kernel_mod, triton_linear
from imagegen.ops.causal_linear import linear_attention_reference
from imagegen.tuning import probe
from fixtures import ci_requires, make_raw_qkv, out_and_grads

try:
    import triton  # noqa: F401
    MISSING = None
except ImportError as exc:
    MISSING = str(exc)
REQUIRED = ci_requires("triton")
if MISSING and REQUIRED:
    raise RuntimeError(f"IMAGEGEN_CI_REQUIRE requires triton, but it does not import: {MISSING}")
pytestmark = [pytest.mark.skipif(MISSING is not None, reason=f"triton does not import: {MISSING}"),
              pytest.mark.slow]        # Triton's interpreter: seconds per test; CI runs them all

DEVICES = [pytest.param("cpu", id="interp"),
           pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
               not torch.cuda.is_available(), reason="needs a CUDA GPU")])]
DTYPES = [pytest.param(torch.float32, id="f32"), pytest.param(torch.float16, id="f16"),
          pytest.param(torch.bfloat16, id="bf16")]
TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}  # relative to the largest |value|


@pytest.fixture(params=DEVICES)
def device(request):
    interpreting = triton_linear.interpreting()
    if request.param == "cpu" and not interpreting:
        if not torch.cuda.is_available() and REQUIRED:
            pytest.fail("IMAGEGEN_CI_REQUIRE requires triton, but TRITON_INTERPRET is off and no GPU is visible: "
                        "nothing would run the kernels")
        pytest.skip("triton runs compiled in this process (TRITON_INTERPRET off): the cuda cases cover these; "
                    "TRITON_INTERPRET=1 runs the interpreter")
    if request.param == "cuda" and interpreting:
        pytest.skip("TRITON_INTERPRET=1: kernels would be interpreted, not compiled")
    return request.param


def needs(device, dtype):
    if device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("the interpreter's bfloat16 arithmetic is wrong (a known Triton limitation)")


def check(got, want, dtype):
    """Each of out, grads within TOL[dtype] of the largest |value| of the float64 reference's, or of 1
    where all are small (at length 1 the gradient of q is ~eps: float32 cancellation, not a scale)."""
    for name, a, b in zip(("out", "grad_q", "grad_k", "grad_v"), got, want):
        assert a.dtype == dtype, name
        err = (a.double().cpu() - b).abs().max().item() / max(b.abs().max().item(), 1.0)
        assert err < TOL[dtype], f"{name}: error {err:.2e} relative to the largest value >= {TOL[dtype]}"


def rounded(shape, dtype, device, seed=0):
    """q, k, v at dtype on device and the same values in float64 on the CPU (for the reference)."""
    low = tuple(t.to(device, dtype) for t in make_raw_qkv(*shape, seed=seed))
    return low, tuple(t.cpu().double() for t in low)


SHAPES = [  # N, H, L, E, M, chunk
    (2, 2, 37, 16, 16, 16),    # three chunks and a tail
    (1, 2, 32, 16, 16, 16),    # a whole number of chunks
    (1, 1, 1, 16, 16, None),   # length 1
    (2, 3, 19, 5, 7, 16),      # E != M, both below the smallest block (padded)
    (1, 1, 20, 32, 24, None),
    (1, 1, 17, 64, 64, None),
    (1, 1, 9, 128, 128, None),  # state split into 64-wide blocks, chunk 16
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_backward_match_float64_reference(shape, device):
    *dims, chunk = shape
    low, wide = rounded(dims, torch.float32, device)
    got = out_and_grads(lambda *t: triton_linear.linear_attention_triton(*t, eps=ops.EPS, chunk=chunk), *low)
    check(got, out_and_grads(linear_attention_reference, *wide), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_half_precision_inputs_sum_in_float32(dtype, device):
    needs(device, dtype)
    low, wide = rounded((2, 2, 40, 32, 32), dtype, device, seed=1)
    got = out_and_grads(lambda *t: triton_linear.linear_attention_triton(*t, eps=ops.EPS, chunk=16), *low)
    check(got, out_and_grads(linear_attention_reference, *wide), dtype)


def test_longer_sequence_float32(device):
    """Many chunks carry the state: L = 300 (chunk 64, a tail of 44) at the model's head dim 32."""
    low, wide = rounded((1, 2, 300, 32, 32), torch.float32, device, seed=2)
    got = out_and_grads(lambda *t: triton_linear.linear_attention_triton(*t, eps=ops.EPS), *low)
    check(got, out_and_grads(linear_attention_reference, *wide), torch.float32)


def test_strided_views_of_one_projection_and_packed_form(device):
    """q, k, v as views of one (N, L, 3 H E) projection, and that projection passed whole
    (`linear_attention_qkv`, whose gradient comes back as one tensor)."""
    N, L, H, E = 2, 21, 3, 16
    qkv = (torch.randn(N, L, 3 * H * E, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2)
    q, k, v = (t.view(N, L, H, E).transpose(1, 2) for t in qkv.to(device, torch.float32).chunk(3, dim=-1))
    assert q.stride(-1) == 1 and not q.is_contiguous()
    got = out_and_grads(lambda *t: ops.linear_attention(*t, impl="triton"), q, k, v)
    heads = (t.view(N, L, H, E).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
    want = out_and_grads(linear_attention_reference, *heads)
    check(got, want, torch.float32)
    assert got[0].transpose(1, 2).is_contiguous()                      # heads merge as a view

    x = qkv.to(device, torch.float32).requires_grad_()
    g = torch.randn(N, L, H * E, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    out = ops.linear_attention_qkv(x, H, impl="triton")
    (grad,) = torch.autograd.grad(out, x, g.to(device, torch.float32))
    xr = qkv.clone().requires_grad_()
    ref = linear_attention_reference(*(t.view(N, L, H, E).transpose(1, 2) for t in xr.chunk(3, dim=-1)))
    ref = ref.transpose(1, 2).reshape(N, L, H * E)
    (grad_ref,) = torch.autograd.grad(ref, xr, g)
    torch.testing.assert_close(out.double().cpu(), ref.detach(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grad.double().cpu(), grad_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decoding_step_over_a_sequence_equals_forward(dtype, device):
    """Stepping position by position from a zero state gives the forward's outputs, and the
    carried state ends as S = sum phi(k) v^T, z = sum phi(k) (the last column)."""
    needs(device, dtype)
    N, H, L, E, M = 2, 3, 13, 16, 24
    low, wide = rounded((N, H, L, E, M), dtype, device, seed=5)
    state = torch.zeros(N * H, E, M + 1, device=device, dtype=torch.float32)
    steps = torch.cat([triton_linear.triton_step(*(t[:, :, i:i + 1] for t in low), state, ops.EPS)
                       for i in range(L)], dim=2)
    want = linear_attention_reference(*wide)
    err = (steps.double().cpu() - want).abs().max().item() / want.abs().max().item()
    assert steps.dtype == dtype and err < TOL[dtype], f"step outputs: error {err:.2e}"
    kf = ops.phi(wide[1])
    S = torch.cat([torch.einsum("nhle,nhlm->nhem", kf, wide[2]), kf.sum(2).unsqueeze(-1)], -1).reshape(N * H, E, M + 1)
    torch.testing.assert_close(state.double().cpu(), S, rtol=1e-5, atol=1e-4)


def test_linear_attention_module_steps_through_triton(device, monkeypatch):
    """The model's attention with impl="triton": its forward and its steps (Triton's step kernel on
    the carried S, Z) agree, as the attention protocol demands."""
    monkeypatch.setattr(dispatch, "TRITON_DEVICES", ("cuda", "cpu"))
    torch.manual_seed(0)
    attn = LinearAttention(32, 2, impl="triton").to(device)
    x = torch.randn(2, 11, 32, device=device)
    with torch.no_grad():
        want = attn(x)
        state = attn.init_state(2, 11, device, torch.float32)
        assert state.form == "triton"
        got = torch.stack([attn.step(x[:, t], state)[0] for t in range(11)], 1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# ---- dispatch ------------------------------------------------------------------------------

@pytest.fixture
def fresh_probe(monkeypatch):
    """The Triton check run anew, with "auto" taking Triton on CPU tensors as it does on CUDA."""
    monkeypatch.setattr(dispatch, "TRITON_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(triton_linear, "_errors", {})
    monkeypatch.setattr(kernel_mod, "_warned", set())


def test_auto_takes_triton_where_it_works(fresh_probe, device):
    q, k, v = (t.to(device, torch.float32) for t in make_raw_qkv(1, 2, 9, 4, 4))
    with warnings.catch_warnings(), torch.inference_mode():     # the check runs its backward all the same
        warnings.simplefilter("error")
        assert ops.decide_impl(q, v, fused=True).value == "triton"
        torch.testing.assert_close(ops.linear_attention(q, k, v), ops.linear_attention(q, k, v, impl="chunked"))
    assert ops.decide_impl(q, v).value == "chunked"                     # the bare numerator: no Triton kernel
    assert ops.decide_impl(q.double(), v.double(), fused=True).value == "chunked"   # unsupported dtype


@pytest.fixture
def gpu_probes_on(fresh_probe, probes_on, monkeypatch):
    """Probes on (tests/conftest.py), "auto" taking Triton on CPU tensors, and the Triton check taken as passed."""
    monkeypatch.setattr(dispatch, "triton_error", lambda *args, **kw: None)


def test_auto_takes_triton_without_timing_or_building_an_unbuilt_kernel(gpu_probes_on, device, monkeypatch):
    monkeypatch.setattr(dispatch, "prebuilt_error", lambda device_type: "not built yet")
    monkeypatch.setattr(dispatch, "time_gpu_impls", lambda *args: pytest.fail("timed an unbuilt kernel"))
    q, k, v = (t.to(device, torch.float32) for t in make_raw_qkv(1, 2, 9, 4, 4))
    assert ops.decide_impl(q, v, fused=True).value == "triton"


@pytest.mark.parametrize("kernel_ms, impl", [(5.0, "kernel"), (9.0, "triton")])
def test_auto_times_a_built_kernel_against_triton_once(gpu_probes_on, device, monkeypatch, kernel_ms, impl):
    """Where the csrc kernel is built, auto times it against Triton once per GPU model, shape and dtype
    (cached) and takes it only when it is probe.MARGIN times faster."""
    if ops.kernel_error(device) is not None:
        pytest.skip(f"the {device} kernel cannot be built here")
    calls = []
    monkeypatch.setattr(dispatch, "time_gpu_impls", lambda *args: calls.append(args) or (10.0, kernel_ms))
    q, k, v = (t.to(device, torch.float32).requires_grad_() for t in make_raw_qkv(1, 2, 100, 4, 4))
    assert ops.decide_impl(q, v, fused=True).value == impl
    assert ops.decide_impl(q, v, fused=True).value == impl and len(calls) == 1
    assert calls[0] == (q.device, 128, 4, 4, torch.float32, True)          # L 100 -> timed at 128
    monkeypatch.setattr(probe, "_verdicts", {})
    monkeypatch.setattr(dispatch, "time_gpu_impls", lambda *args: (10.0, 100.0 / kernel_ms))  # the opposite, if timed
    assert ops.decide_impl(q, v, fused=True).value == impl                          # read from the cache file
    assert ops.decide_impl(q, v).value == "chunked"                                 # the bare numerator: not timed


def test_training_header_says_what_auto_runs_on_a_gpu_and_why(gpu_probes_on, device, monkeypatch):
    reason = lambda: ops.auto_impl_line({"attention": "linear", "d_model": 16, "n_heads": 2}, 100,  # noqa: E731
                                         torch.device(device))
    monkeypatch.setattr(dispatch, "prebuilt_error", lambda device_type: "not built yet, ...")
    assert reason() == "linear attention impl=auto: triton (the CUDA kernel is not timed: not built yet, ...)"
    if ops.kernel_error(device) is None:
        monkeypatch.setattr(dispatch, "prebuilt_error", lambda device_type: None)
        monkeypatch.setattr(dispatch, "time_gpu_impls", lambda *args: (10.0, 5.0))
        assert reason().startswith("linear attention impl=auto: kernel (the CUDA kernel fwd+bwd measured 2.00x "
                                   "Triton's speed here, measured now, cached in ")
    monkeypatch.setattr(dispatch, "triton_error", lambda *args, **kw: "forced failure")
    assert reason() == "linear attention impl=auto: chunked (Triton unavailable: forced failure)"


def test_gpu_impl_probe_times_both_forms(gpu_probes_on, device):
    if ops.kernel_error(device) is not None:
        pytest.skip(f"the {device} kernel cannot be built here")
    state = torch.random.get_rng_state()
    for grad in (True, False):
        triton_ms, kernel_ms = dispatch.time_gpu_impls(torch.device(device), 64, 8, 8, torch.float32, grad)
        assert triton_ms > 0 and kernel_ms > 0
    assert torch.equal(state, torch.random.get_rng_state())


def test_compile_failure_falls_back_to_chunked_with_one_warning(fresh_probe, device, monkeypatch):
    def broken(name, device_type):
        raise RuntimeError("CompilationError: at 12:4: forced failure\nmore lines")
    monkeypatch.setattr(triton_linear, "kernel", broken)
    q, k, v = (t.to(device, torch.float32) for t in make_raw_qkv(1, 2, 9, 4, 4))
    with pytest.warns(RuntimeWarning, match="CompilationError: at 12:4: forced failure.*chunked") as record:
        got = ops.linear_attention(q, k, v)
        ops.linear_attention(q, k, v)
        assert ops.decide_impl(q, v, fused=True).value == "chunked"
    assert len(record) == 1
    torch.testing.assert_close(got, ops.linear_attention(q, k, v, impl="chunked"))
    with pytest.raises(ValueError, match=r"forced failure.*impl='chunked'"):
        ops.linear_attention(q, k, v, impl="triton")


def test_wrong_results_count_as_failure(fresh_probe, device, monkeypatch):
    """A kernel that compiles but computes wrong is not taken either."""
    assert triton_linear.triton_error(device) is None
    monkeypatch.setattr(triton_linear, "_errors", {})
    real = triton_linear.linear_attention_triton
    monkeypatch.setattr(triton_linear, "linear_attention_triton", lambda *t, **kw: real(*t, **kw) * 1.01)
    assert "forward differs" in triton_linear.triton_error(device)


def test_impl_triton_errors_name_the_fix():
    q, k, v = make_raw_qkv(1, 1, 4, 2, 2)
    with pytest.raises(ValueError, match=r"linear_attention only.*impl='chunked'"):
        ops.causal_product(q, k, v, impl="triton")
    with pytest.raises(ValueError, match=r"float32, float16, got float64.*impl='chunked'"):
        ops.linear_attention(q, k, v, impl="triton")
    with pytest.raises(ValueError, match="E, M <= 128"):
        ops.linear_attention(*(t.float() for t in make_raw_qkv(1, 1, 4, 129, 2)), impl="triton")
    with pytest.raises(ValueError, match="power of two"):
        triton_linear.linear_attention_triton(q.float(), k.float(), v.float(), eps=ops.EPS, chunk=24)


@pytest.mark.slow
@pytest.mark.parametrize("dims, dtype", [("128", "float32"), ("32", "bfloat16")])
def test_kernels_compile_for_sm90_within_shared_memory(dims, dtype):
    """What the launches compile to on a GPU, compiled here for sm_90 (no GPU needed, Triton's compiler
    and ptxas run on the CPU) in a process without the interpreter: every kernel builds, each
    within the shared memory of the smallest GPU (float32 at E = 128 is the largest)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "imagegen.ops.triton_compile", "--arch", "90", "--dims", dims,
                           "--dtypes", dtype], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("sm_90")]
    assert len(lines) == 5 and all(ln.endswith("ok") for ln in lines), proc.stdout


@pytest.mark.slow
def test_cpu_users_never_import_triton():
    """With triton unimportable: imagegen imports, trains a step and samples on the CPU, and the
    Triton check says why it cannot run."""
    code = """
import sys
sys.modules["triton"] = None          # any import of triton now raises ImportError
import torch
import imagegen, imagegen.model.transformer, imagegen.sampling.decode, imagegen.commands.train
from imagegen.model.transformer import PixelTransformer
from imagegen.ops import triton_linear
model = PixelTransformer(16, 1, 4, attention="linear", n_layers=1, d_model=16, n_heads=2, d_ff=32)
model.nll(torch.randint(0, 256, (2, 16), dtype=torch.uint8)).mean().backward()
print(imagegen.sampling.decode.generate(model, 2, batch_size=2).shape)
print(triton_linear.triton_error("cpu"))
"""
    env = {**os.environ, "IMAGEGEN_DISABLE_KERNEL": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    shape, why = proc.stdout.strip().splitlines()[-2:]
    assert shape == "torch.Size([2, 16])"
    assert "triton does not import" in why and "imagegen[triton]" in why
