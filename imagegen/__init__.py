"""imagegen: pixel-level autoregressive image transformers (softmax, linear as an RNN, LSH).

`imagegen.load(name_or_path)` returns a model to generate, complete and score with (imagegen/api.py);
the commands are imagegen-train, -eval, -sample, -bench, -plot, -export and -convert."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .api import Model

__all__ = ["load"]


def load(name_or_path: str = "mnist-linear", device: str | torch.device = "cpu", threads: int | None = 0,
         build_kernel: bool = True) -> Model:
    """A trained model (a shipped name, a .safetensors or a .pt file); see imagegen.api.load and Model.
    threads (CPU): 0 fits torch's thread count to the cores free now, N sets N (at most the cores),
    None leaves it; build_kernel=False: never wait for the C++ kernel's first compile."""
    from .api import load as _load          # torch is imported on first use, not by `import imagegen`
    return _load(name_or_path, device, threads, build_kernel)
