"""Causal linear attention ops: `causal_product` (the numerator),
`causal_linear_attention` (normalised, on feature-mapped q, k), `linear_attention`
(the model's: phi(x) = elu(x) + 1 applied here), `mapped_linear_attention` (the model's with
another feature map, applied by the caller) and `gated_linear_attention` (with a decay per
position, gated_linear.py), each with a choice of implementation.

impl names:
  "reference"  quadratic masked product, O(L^2) memory; for tests
  "cumsum"     cumulative sum of k v^T outer products, O(L E M) memory
  "chunked"    masked products inside chunks + carried state (pure PyTorch, any device)
  "kernel"     compiled recurrent kernel of csrc/ (CPU: float32/64, bfloat16; CUDA: float32/16, bfloat16);
               on the CPU `linear_attention` runs it fused with phi and the normalisation, and
               `mapped_linear_attention` the same with phi the identity.
               On CUDA only when asked for: compile-checked in CI (csrc/compile_check.sh), run on one GPU (docs/gpu.md)
  "triton"     `linear_attention` only: the fused chunked Triton kernels of triton_linear.py (CUDA;
               CPU tensors under Triton's interpreter, for tests)
  "auto"       the fastest available for the device and shape (`dispatch.decide_impl`: on the CPU
               measured once per machine by `imagegen.tuning.probe`, else by rule)

The files: public.py (the ops), dispatch.py (which impl runs), causal_linear.py (the PyTorch forms and
the naive reference), gated_linear.py, kernel.py (the C++ kernels in autograd), build.py (their build),
decode.py (the C++ decoding step), dense.py / layout.py / int8.py (the Dense layer's products),
triton_linear.py and triton_kernels.py (Triton). This face only re-exports.
"""
from .build import ensure_kernel, kernel_error, load_kernel, prebuilt_only, warn_fallback
from .causal_linear import EPS, phi
from .decode import DecodeHead, DecodeLayer, decode_step, fused_state, fused_step
from .dispatch import (IMPLS, TRITON_DEVICES, auto_impl_line, decide_impl,
                       default_chunk_size, resolve_impl, uses_fused_kernel, uses_triton_step)
from .gated_linear import gated_step
from .public import (causal_linear_attention, causal_product, compute_dtype, gated_linear_attention,
                     linear_attention, linear_attention_qkv, mapped_linear_attention)
from .triton_linear import triton_error, triton_step

__all__ = ["auto_impl_line", "causal_linear_attention", "causal_product", "compute_dtype", "decide_impl",
           "decode_step", "DecodeHead", "DecodeLayer", "default_chunk_size", "ensure_kernel", "EPS", "fused_state",
           "fused_step", "gated_linear_attention", "gated_step", "IMPLS", "kernel_error", "linear_attention",
           "linear_attention_qkv", "load_kernel", "mapped_linear_attention", "phi", "prebuilt_only", "resolve_impl",
           "TRITON_DEVICES", "triton_error", "triton_step", "uses_fused_kernel", "uses_triton_step", "warn_fallback"]
