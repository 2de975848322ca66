"""The dtypes products run in, by their precision names (float32, bfloat16, int8), and autocast.

int8 has no torch dtype of its own for a product that takes and returns float32 activations:
`INT8` (torch.qint8) names it (precision=int8; imagegen.ops.dense: `Dense.cast`, `quantize`, `dense`).
"""
from contextlib import nullcontext

import torch

INT8 = torch.qint8    # the "dtype" of int8 products (precision=int8)


def dtype_name(dtype):
    """torch.float32 -> 'float32'; the int8 products' torch.qint8 -> 'int8' (the precision's name)."""
    return "int8" if dtype == INT8 else str(dtype).replace("torch.", "")


def precision_dtype(name):
    """A precision's dtype name ('float32', 'bfloat16', 'int8') -> its dtype (`dtype_name` reversed)."""
    return INT8 if name == "int8" else getattr(torch, name)


def activation_dtype(dtype):
    """The dtype activations and states are kept in for products in `dtype`: float32 for int8
    (its products take and return float32), else dtype itself."""
    return torch.float32 if dtype == INT8 else dtype


def autocast(device, enabled):
    """A bfloat16 autocast context for `device` when enabled, else a no-op context."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else nullcontext()
