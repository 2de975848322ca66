"""The compiled causal products (csrc/, built by `build.py`) wrapped in autograd.

`causal_product_kernel(q, k, v)` computes the same numerator as the pure-PyTorch forms,
V'_i = sum_{j<=i} (q_i . k_j) v_j for q, k (N, H, L, E) and v (N, H, L, M), with the
recurrent forward and the constant-memory backward of Algorithm 1; `linear_attention_kernel`
the model's whole attention (phi, numerator and normaliser) fused on the CPU, or (mapped) the same on
features of another map.
"""
import torch
from torch.autograd.function import once_differentiable

from ..dtypes import dtype_name
from .build import load_kernel

DTYPES = {"cpu": (torch.float32, torch.float64, torch.bfloat16),
          "cuda": (torch.float32, torch.float16, torch.bfloat16)}
MAX_CUDA_DIM = 256  # largest E and M the CUDA kernel supports (csrc/causal_product_cuda.cu)


def unsupported(takes, dtypes, max_dim, q, v):
    """None when what `takes` names (say "the cpu kernel supports") takes q's dtype, one of `dtypes`,
    and head dims E = q.shape[-1], M = v.shape[-1] up to max_dim (None: any), else a sentence why not."""
    if q.dtype not in dtypes:
        return f"{takes} {', '.join(map(dtype_name, dtypes)) or 'no dtype'}, got {dtype_name(q.dtype)}"
    if max_dim is not None and max(q.shape[-1], v.shape[-1]) > max_dim:
        return f"{takes} head dims E, M <= {max_dim}, got E={q.shape[-1]}, M={v.shape[-1]}"
    return None


def kernel_unsupported(q, v):
    """None when the kernel handles this dtype/shape on this device, else a sentence why not."""
    device_type = q.device.type
    return unsupported(f"the {device_type} kernel supports", DTYPES.get(device_type, ()),
                       MAX_CUDA_DIM if device_type == "cuda" else None, q, v)


class CausalProduct(torch.autograd.Function):
    """Autograd wrapper: forward and backward both call the compiled kernel."""

    @staticmethod
    def forward(ctx, q, k, v):
        module = load_kernel(q.device.type)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        ctx.save_for_backward(q, k, v)
        return module.forward(q, k, v)  # (N, H, L, M)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        if not any(ctx.needs_input_grad):
            return None, None, None
        module = load_kernel(q.device.type)
        grads = module.backward(q, k, v, grad_out.to(v.dtype).contiguous())
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad))


def causal_product_kernel(q, k, v):
    """Compiled causal numerator for q, k (N, H, L, E), v (N, H, L, M) -> (N, H, L, M)."""
    return CausalProduct.apply(q, k, v)


def unit_last_stride(x):
    return x if x.stride(-1) == 1 else x.contiguous()


class FusedLinearAttention(torch.autograd.Function):
    """The CPU kernel's fused attention: phi, numerator, denominator and division in one sweep
    forward and two backward; keeps only 1 / (den + eps) per position beside its inputs and output.
    Takes q, k, v (N, H, L, E), or one tensor (N, L, 3, H, E) holding them (as a projection makes
    them), whose gradient then comes back whole rather than as three pieces to concatenate.
    mapped: q, k are features of another map (phi the identity), as `mapped_linear_attention` takes them."""

    @staticmethod
    def forward(ctx, eps, mapped, *inputs):
        inputs = tuple(unit_last_stride(x) for x in inputs)   # saved so: backward copies nothing again
        out, inv = load_kernel("cpu").attention_forward(*unpack(inputs), eps, mapped=mapped)
        ctx.save_for_backward(*inputs, out, inv)
        ctx.mapped = mapped
        return out  # (N, H, L, M), laid out (N, L, H, M)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        *inputs, out, inv = ctx.saved_tensors
        if len(inputs) == 1:
            grads = (torch.empty_like(inputs[0], memory_format=torch.contiguous_format),)
        else:
            grads = tuple(empty_grad(x) for x in inputs)
        load_kernel("cpu").attention_backward(*unpack(inputs), out, inv, unit_last_stride(grad_out.to(out.dtype)),
                                              *unpack(grads), mapped=ctx.mapped)
        return (None, None, *(g if need else None for g, need in zip(grads, ctx.needs_input_grad[2:])))


def unpack(inputs):
    """(q, k, v) from [q, k, v] or [qkv (N, L, 3, H, E)], as (N, H, L, E) views."""
    return inputs[0].permute(2, 0, 3, 1, 4).unbind(0) if len(inputs) == 1 else inputs


def empty_grad(x):
    """An uninitialised gradient for x (N, H, L, D): contiguous where x is (the kernel then writes
    each head's rows one after another: 5% less backward time at L 3,072 than rows H apart),
    else laid out (N, L, H, D), as a projection's views are."""
    return torch.empty_like(x, memory_format=torch.contiguous_format) if x.is_contiguous() else empty_heads_last(x)


def empty_heads_last(x):
    """An uninitialised tensor shaped like x (N, H, L, D), laid out (N, L, H, D)."""
    N, H, L, D = x.shape
    return x.new_empty(N, L, H, D).transpose(1, 2)


def linear_attention_kernel(*inputs, eps, mapped=False):
    """Fused CPU attention on raw q, k (N, H, L, E), v (N, H, L, M) -> (N, H, L, M), or on
    qkv (N, L, 3, H, E) holding the three (see FusedLinearAttention); mapped: on features q, k."""
    return FusedLinearAttention.apply(eps, mapped, *inputs)
