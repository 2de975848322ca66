"""The CPU kernel's decoding interface: the fused attention's state and step, and the whole linear
model's step in one C++ call (`decode_step`), with the tensors it reads named in order.
"""
from typing import NamedTuple

import torch

from .build import load_kernel
from .int8 import asked_form


def fused_state(like, batch_heads, E, M):
    """A zero decoding state (S and z of each of batch_heads heads, float32 for bfloat16) for `fused_step`."""
    return load_kernel("cpu").attention_state(like, batch_heads, E, M)


def fused_step(q, k, v, state, eps, mapped=False):
    """One decoding position through the fused CPU kernel: raw q, k (N, H, 1, E) (mapped: features
    of another map, (N, H, 1, F)), v (N, H, 1, M) -> (N, H, 1, M), laid out (N, 1, H, M); state (from
    `fused_state`) is updated in place."""
    return load_kernel("cpu").attention_forward(q, k, v, eps, state, mapped=mapped)[0]


class DecodeLayer(NamedTuple):
    """The tensors of one block that `decode_step` reads, in the order it reads them: the C++ names
    them in one list (csrc/cpu_kernel.h, DECODE_LAYER_WEIGHTS), which the built module exports as
    `decode_layer_weights`; tests/test_ops.py checks that it equals these fields. The products'
    weights and biases (qkv, out, ff1, ff2) are those of the decoding state, in the products' dtype
    (`Dense.cast`: bfloat16 copies for bfloat16 decoding, prepacked for oneDNN at larger batches);
    the LayerNorms' are the parameters; state is the block's `fused_state`, advanced in place; features
    what its feature map reads in the step (favor's scaled draw E^-1/4 omega in the features' dtype; an
    empty tensor for elu and relu)."""
    ln1_weight: torch.Tensor
    ln1_bias: torch.Tensor
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor
    out_weight: torch.Tensor
    out_bias: torch.Tensor
    ln2_weight: torch.Tensor
    ln2_bias: torch.Tensor
    ff1_weight: torch.Tensor
    ff1_bias: torch.Tensor
    ff2_weight: torch.Tensor
    ff2_bias: torch.Tensor
    state: torch.Tensor
    features: torch.Tensor


class DecodeHead(NamedTuple):
    """The head's tensors that `decode_step` reads, in order (csrc/cpu_kernel.h, DECODE_HEAD_WEIGHTS;
    the module's `decode_head_weights`): the final LayerNorm and the output projection."""
    ln_f_weight: torch.Tensor
    ln_f_bias: torch.Tensor
    proj_weight: torch.Tensor
    proj_bias: torch.Tensor


def decode_step(h, layers, head, n_heads, ln_eps, eps, features="elu"):
    """One decoding position of a whole linear PixelTransformer in one C++ call (see
    `PixelTransformer.kernel_weights`): h (N, D) embedded tokens, layers a DecodeLayer per block,
    head a DecodeHead, features the blocks' feature map ("elu", "relu" or "favor") -> parameters (N, P).
    int8 weights run in the form `int8.forced_form` asks for."""
    return load_kernel("cpu").decode_step(h, layers, head, n_heads, ln_eps, eps, features, asked_form())
