"""bfloat16 autocast for training, where the hardware multiplies bfloat16 fast.

Matrix products run in bfloat16 (float32 accumulation); parameters, optimizer state, the
linear attention's sums (`imagegen.ops.linear_attention`) and the loss stay float32.
On this project's CPU (a Xeon with AMX tiles) a 49152 x 256 x 1024 product takes 45 ms in
bfloat16 against 162 ms in float32; without AMX or a CUDA GPU bfloat16 is slower, hence "auto".
"""
from contextlib import nullcontext

import torch

from .errors import UserError


def has_fast_bf16(device):
    """CUDA devices that support bfloat16, and CPUs with AMX matrix tiles."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)      # private, so looked up with care
    return device.type == "cpu" and amx is not None and amx()


def use_bf16(setting, device, key="train.bf16"):
    """The bf16 setting (auto, true or false) resolved for `device`."""
    if setting == "auto":
        return has_fast_bf16(device)
    if isinstance(setting, bool):
        return setting
    raise UserError(f"{key} must be auto, true or false, not {setting!r}.")


def autocast(device, enabled):
    """A bfloat16 autocast context for `device` when enabled, else a no-op context."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else nullcontext()
