"""imagegen: pixel-level autoregressive image transformers (softmax, linear as an RNN, LSH).

`imagegen.load(name_or_path)` returns a model to generate, complete and score with (imagegen/api.py);
the commands are imagegen-train, -eval, -sample, -bench, -plot, -export and -convert."""


def load(name_or_path="mnist-linear", device="cpu", threads=0):
    """A trained model (a shipped name, a .safetensors or a .pt file); see imagegen.api.Model.
    threads (CPU): 0 fits torch's thread count to the cores free now, N sets N (at most the cores),
    None leaves it."""
    from .api import load as _load          # torch is imported on first use, not by `import imagegen`
    return _load(name_or_path, device, threads)
