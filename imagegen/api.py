"""The Python API: a trained model by name or path, and what the commands do with it, in a few lines.

    import imagegen
    model = imagegen.load("mnist-linear")                 # a shipped model, a .safetensors or a .pt file
    digits = model.generate(labels=[7] * 8, guidance=2)   # (8, 28, 28, 1) uint8
    model.grid(digits, nrow=8).save("sevens.png")
    halves = model.complete(digits[:2], rows=14, n=4)     # keep 14 rows of each, sample the rest 4 times
    test_images, test_labels = model.load_split("test", n=500)   # the model's own dataset, from data.root
    model.bits_per_dim(test_images, labels=test_labels)

Images are numpy uint8 arrays (N, H, W, C); labels are class numbers (model.class_names names them).

On the CPU, load(threads=0) sets torch's thread count to the cores free now, and the model's methods
look again when the last look is over threads.LOOK_SECONDS old (0.2 s; docs/threads.md); threads=N
sets N; threads=None leaves torch's thread count alone. On the CPU, load() also sets glibc's malloc to
keep freed memory, as every command does (imagegen.ops.allocator.for_device).
"""
import time

import numpy as np
import torch

from .tuning import threads as _threads
from .store import checkpoint, shipped
from .data.sets import dataset_info, load_from_config
from .config import check_classes, check_sampling
from .errors import UserError
from .memory import check_images_fit
from .model.transformer import model_dims
from .ops.allocator import for_device
from .precision import resolve_precision
from .sampling.decode import generate, grid, resolve_sampler, to_images
from .bits_per_dim import bits_per_dim


def load(name_or_path=shipped.DEFAULT, device="cpu", threads=0):
    """The model a checkpoint= value names (shipped name, .safetensors with its .json, or .pt), checked
    as every command checks it, on `device`, in evaluation mode. threads (CPU): 0 fits torch's thread
    count to the cores free now (and the methods look again every few minutes), N sets N, None
    leaves it alone."""
    path = shipped.resolve(name_or_path)
    ck = checkpoint.load(path)
    model = Model(checkpoint.model_from_checkpoint(ck, path).to(device).eval(), ck, threads=threads)
    for_device(model.device)       # as every command: no page faults per call on the CPU
    model._fit_threads(force=True)
    return model


class Model:
    """A loaded PixelTransformer with its dataset's shape and class names. Attributes: module (the
    torch module), info (DatasetInfo: height, width, channels, class_names), config (the run's),
    guidance (the default recorded with a shipped model, else 1), record (a shipped model's record, else {})."""

    def __init__(self, module, ck, threads=None):
        self.module, self.config = module, ck["config"]
        self.info = dataset_info(self.config["data"])
        self.record = ck.get("record", {})
        self.guidance = self.record.get("guidance", 1.0)
        self.threads, self._looked = threads, None

    def _fit_threads(self, force=False):
        """torch's thread count for this model's work on the CPU (see `load`): threads=0 looks at the
        free cores at load and again when the last look is over LOOK_SECONDS old; N sets N."""
        if self.threads is None or self.device.type != "cpu":
            return
        if self.threads:
            if force:
                _threads.fit_threads(self.threads)       # says once when N is more than the cores free
            else:
                torch.set_num_threads(self.threads)
        elif force or self._looked is None or time.monotonic() - self._looked >= _threads.LOOK_SECONDS:
            _threads.fit_threads(0)
            self._looked = time.monotonic()

    @property
    def class_names(self):
        """Names of the classes labels refer to (empty for an unconditional model)."""
        return list(self.info.class_names) if self.module.num_classes else []

    @property
    def device(self):
        return next(self.module.parameters()).device

    def generate(self, n=None, labels=None, temperature=1.0, guidance=None, seed=0, precision="float32",
                 batch_size=64, progress=False):
        """n images (N, H, W, C) uint8; labels: one class for all, or one per image (n defaults to
        their count, else 16); guidance: None takes the model's default."""
        self._fit_threads()
        labels = self._labels(labels)
        n = n if n is not None else (len(labels) if labels is not None and len(labels) > 1 else 16)
        check_sampling(n=n, batch_size=batch_size, temperature=temperature, guidance=guidance)
        check_images_fit(self.info, n, f"n={n:,}")
        seqs = generate(self.module, n, temperature=temperature, seed=seed, batch_size=batch_size,
                        labels=labels, guidance=self.guidance if guidance is None else guidance,
                        dtype=resolve_precision(precision, self.device, dims=model_dims(self.module), batch=batch_size,
                                                record=self.record),
                        progress=progress)
        return to_images(seqs, self.info)

    def complete(self, images, rows=None, n=1, labels=None, temperature=1.0, guidance=None, seed=0,
                 precision="float32", batch_size=64):
        """Keep the top `rows` image rows (default: half) of images (B, H, W, C) uint8 and sample the
        rest n times each: (B, n, H, W, C) uint8."""
        self._fit_threads()
        check_sampling(n=n, batch_size=batch_size, temperature=temperature, guidance=guidance)
        images = self._images(images)
        check_images_fit(self.info, len(images) * n, f"{len(images):,} images x n={n:,}")
        rows = self.info.height // 2 if rows is None else rows
        if not 0 <= rows <= self.info.height:
            raise UserError(f"rows must lie in 0..{self.info.height}, got {rows}.")
        keep = rows * self.info.width * self.info.channels
        prefix = torch.from_numpy(images.reshape(len(images), -1)[:, :keep]).repeat_interleave(n, dim=0)
        labels = self._labels(labels)
        if labels is not None and len(labels) == len(images):
            labels = labels.repeat_interleave(n)
        seqs = generate(self.module, len(prefix), prefix=prefix, temperature=temperature, seed=seed,
                        batch_size=batch_size, labels=labels, guidance=self.guidance if guidance is None else guidance,
                        dtype=resolve_precision(precision, self.device, dims=model_dims(self.module),
                                                batch=batch_size, record=self.record))
        return to_images(seqs, self.info).reshape(len(images), n, *images.shape[1:])

    def bits_per_dim(self, images, labels=None, batch_size=32):
        """Exact bits/dim of images (B, H, W, C) uint8, given their labels for a class-conditional model."""
        self._fit_threads()
        images = self._images(images)
        x = torch.from_numpy(images.reshape(len(images), -1))
        return bits_per_dim(self.module, x, batch_size, self.device, labels=self._labels(labels, len(images)))

    def load_split(self, split="test", n=None, root=None, download=None):
        """(images (N, H, W, C) uint8, labels (N,) int64) of a split (test, val or train) of the dataset
        this model was trained on, read as the commands read it: from root, else the model's recorded
        data root (a shipped model: $IMAGEGEN_DATA/<name>, else data/<name>); download: None keeps the
        model's setting (True fetches missing official files). n: only the first n images."""
        if n is not None:
            check_sampling(n=n)
        ((x, y),) = load_from_config(self.config["data"], (split,), {"root": root, "download": download},
                                     labels=True)
        count = len(x) if n is None else min(n, len(x))
        # a folder gives source.ImageRows over its cache: one uint8 tensor per index
        seqs = x[:count] if isinstance(x, torch.Tensor) else torch.stack([x[i] for i in range(count)])
        return to_images(seqs, self.info).copy(), torch.as_tensor(y[:count]).numpy().astype(np.int64)

    def grid(self, images, nrow=8, scale=4):
        """A PIL image tiling images (B, H, W, C) uint8, nrow per row, upscaled `scale` times."""
        check_sampling(nrow=nrow, scale=scale)
        return grid(np.asarray(images), nrow=nrow, scale=scale)

    @property
    def sampler(self):
        """How this model samples: step (an RNN or KV cache) or recompute (LSH)."""
        return resolve_sampler(self.module, "auto")

    def _images(self, images):
        images = np.asarray(images)
        if images.dtype != np.uint8:
            bad = images[~np.isin(images, np.arange(256))] if np.issubdtype(images.dtype, np.number) else images
            if bad.size:
                raise UserError(f"images must hold whole numbers in 0..255 (uint8 pixels), got {images.dtype} values "
                                f"such as {bad.flat[0]}; scale them to 0..255 and round, e.g. "
                                f"np.round(images * 255).astype(np.uint8).")
        images = np.ascontiguousarray(images, dtype=np.uint8)
        shape = (self.info.height, self.info.width, self.info.channels)
        if images.ndim == 3 and self.info.channels == 1:
            images = images[..., None]
        if images.ndim != 4 or images.shape[1:] != shape:
            raise UserError(f"images must be (N, {shape[0]}, {shape[1]}, {shape[2]}) uint8, got {images.shape}.")
        return images

    def _labels(self, labels, n=None):
        if labels is None:
            return None
        labels = torch.as_tensor(np.asarray(labels), dtype=torch.long).flatten()
        if self.module.num_classes:
            check_classes(labels.tolist(), self.class_names)
        if n is not None and len(labels) != n:
            raise UserError(f"give one label per image: {n} images but {len(labels)} labels.")
        return labels
