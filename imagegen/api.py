"""The Python API: a trained model by name or path, and what the commands do with it, in a few lines.

    import imagegen
    model = imagegen.load("mnist-linear")                 # a shipped model, a .safetensors or a .pt file
    digits = model.generate(labels=[7] * 8, guidance=2)   # (8, 28, 28, 1) uint8
    model.grid(digits, nrow=8).save("sevens.png")
    halves = model.complete(digits[:2], rows=14, n=4, labels=[7, 7])   # keep 14 rows, sample the rest 4 times
    model.grid(halves).save("halves.png")                 # a row per original, its 4 completions
    test_images, test_labels = model.load_split("test", n=500)   # the model's own dataset, from data.root
    print(model.bits_per_dim(test_images, labels=test_labels))

Images are numpy uint8 arrays (N, H, W, C); labels are class numbers or names (model.class_names), one
for all images or one per image. Every argument is checked by the checker the commands use
(config.check_sampling, config.class_numbers, config.check_device): bad input is one UserError sentence.

Every command that runs a model is a thin layer over this module (imagegen-sample over generate, complete
and grid, imagegen-eval over bits_per_dim), with the same defaults: the same settings give the same bytes.
A Plan (Model.sampling_plan, Model.scoring_plan) is how a call runs here, decided before it runs: a command
shows it and passes it on (plan=...), a script may ignore it.

On the CPU, load(threads=0) sets torch's thread count to the cores free now, and the model's methods
look again when the last look is over threads.LOOK_SECONDS old (0.2 s; docs/threads.md); threads=N
sets N; threads=None leaves torch's thread count alone. On the CPU, load() also sets glibc's malloc to
keep freed memory, as every command does (imagegen.ops.allocator.for_device).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Union

import numpy as np
import torch

from .tuning import threads as _threads
from .store import checkpoint, shipped
from .data.sets import dataset_info, load_from_config
from .config import check_device, check_sampling, class_numbers, shown, whole
from .dtypes import INT8, autocast, dtype_name
from .errors import UserError
from .memory import check_grid_fits, check_images_fit, sampling_batch
from .say import say
from .world import World
from .model.transformer import model_dims
from .ops.allocator import for_device
from .ops.build import prebuilt_only
from .ops.dense import forward_int8_product
from .precision import decide_precision, slow_bf16_note, why_not_int8
from .sampling.plan import Plan
from .sampling.decode import (completion_rows, generate, grid, int8_forward, name_rows, resolve_sampler,
                              sampler_label, to_images)
from .sampling.threads import choose_threads
from .bits_per_dim import LN2, total_nll

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = ["Labels", "Model", "Plan", "from_checkpoint", "load", "use_device"]

Labels = Union[int, str, Sequence[Union[int, str]], None]   # one class (number or name) for all images, or one each


def load(name_or_path: str | Path = shipped.DEFAULT, device: str | torch.device = "cpu", threads: int | None = 0,
         build_kernel: bool = True) -> Model:
    """The model a checkpoint= value names, checked as every command checks it, in evaluation mode.

    Args:
        name_or_path: a shipped name, a .safetensors with its .json, or a .pt file.
        device: cpu, cuda, cuda:N, auto (cuda when torch sees a GPU) or a torch.device.
        threads: on the CPU, 0 fits torch's thread count to the cores free now (and the methods look
            again every few minutes), N sets N (at most the cores this process may run on; more is
            capped, in one line), None leaves it alone.
        build_kernel: False never waits for the C++ kernel's first compile (a minute): from then on this
            process takes it only once built, and runs the chunked form of the same model meanwhile
            (imagegen-sample's choice).

    Returns:
        The loaded Model.
    """
    check_sampling(threads=threads)
    device = use_device(device, threads=None)      # the threads: the Model's own (it looks again later)
    if not build_kernel:
        prebuilt_only()
    path = shipped.resolve(name_or_path)
    return from_checkpoint(checkpoint.load(path), path, device, threads)


def from_checkpoint(ck: dict, path: Path | None = None, device: str | torch.device = "cpu",
                    threads: int | None = None) -> Model:
    """The Model of a checkpoint already read (store.checkpoint.load's dict, or one store.checks.check
    passed, as imagegen-convert checks the weights it will write), in evaluation mode.

    Args:
        ck: the checkpoint: config, model (and ema: taken when present), state or record.
        path: the file it was read from (errors name it; Model.path).
        device, threads: as load's; threads=None (the default here) leaves torch's thread count alone.

    Returns:
        The Model.
    """
    check_sampling(threads=threads)
    device = use_device(device, threads=None)
    model = Model(checkpoint.model_from_checkpoint(ck, path or "checkpoint").to(device).eval(), ck,
                  threads=threads, path=path)
    model._fit_threads(force=True)
    return model


def use_device(device: str | torch.device = "cpu", threads: int | None = 0) -> torch.device:
    """The torch device `device` names (config.check_device), with this process set up to run models there,
    as load and every command (commands/cli.resolve_device) set it up: on the CPU glibc's malloc keeps freed
    memory (ops.allocator.for_device: no page faults per call) and torch's thread count is fitted to the
    cores free now (threads=0) or set to threads=N, at most the cores; threads=None leaves it alone."""
    check_sampling(threads=threads)
    device = check_device(device)
    for_device(device)
    if threads is not None and (device.type == "cpu" or threads):
        _threads.fit_threads(int(threads))
    return device


class Model:
    """A loaded PixelTransformer with its dataset's shape and class names. Attributes: module (the
    torch module), info (DatasetInfo: height, width, channels, class_names), config (the run's),
    guidance (the default recorded with a shipped model, else 1), record (a shipped model's record, else {}),
    path (the file it was read from, or None), step (the training step a .pt checkpoint was saved at, else None)."""

    def __init__(self, module, ck, threads=None, path=None):
        self.module, self.config = module, ck["config"]
        self.info = dataset_info(self.config["data"])
        self.record = ck.get("record", {})
        self.guidance = self.record.get("guidance", 1.0)
        self.path, self.step = path, ck.get("state", {}).get("step")
        self.threads, self._looked = threads, None

    def _fit_threads(self, force=False):
        """torch's thread count for this model's work on the CPU (see `load`): threads=0 looks at the
        free cores at load and again when the last look is over LOOK_SECONDS old; N sets N."""
        if self.threads is None or self.device.type != "cpu":
            return
        if self.threads:
            if force:                                  # N, at most the cores; says once when more than the cores free
                self.threads = _threads.fit_threads(self.threads)
            else:
                torch.set_num_threads(self.threads)
        elif force or self._looked is None or time.monotonic() - self._looked >= _threads.LOOK_SECONDS:
            _threads.fit_threads(0)
            self._looked = time.monotonic()

    @property
    def class_names(self) -> list[str]:
        """Names of the classes labels refer to (empty for an unconditional model)."""
        return list(self.info.class_names) if self.module.num_classes else []

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are."""
        return next(self.module.parameters()).device

    def sampling_plan(self, n: int, precision: str = "auto", batch_size: int = 64, sampler: str = "auto") -> Plan:
        """How sampling n images runs here: the sampler, the batch (min(batch_size, n), checked to fit) and
        the products' precision at that batch (precision.decide_precision; auto: measured, int8 where the
        model's recorded int8 cost allows it).

        Args:
            n: the images drawn (complete: originals x completions).
            precision: float32, bfloat16, auto or int8.
            batch_size: images drawn at a time.
            sampler: auto (step where the attention can, else recompute), step or recompute.

        Returns:
            The Plan; generate and complete take it as plan=... .
        """
        check_sampling(n=n, batch_size=batch_size)
        sampler = resolve_sampler(self.module, sampler)
        batch = sampling_batch(self.module, batch_size, n, sampler, self.device)
        choice = decide_precision(precision, self.device, dims=model_dims(self.module), batch=batch,
                                  record=self.record)
        return Plan(choice.value, dtype_name(choice.value), choice.reason, slow_bf16_note(choice.value, self.device),
                    sampler, sampler_label(self.module, sampler), batch)

    def scoring_plan(self, precision: str = "float32") -> Plan:
        """The products' precision bits_per_dim runs in here: float32, bfloat16, auto (bfloat16 where
        measured faster; never int8) or int8 (CPU; the quantized model's exact bits/dim, its product in
        Plan.int8_product)."""
        choice = decide_precision(precision, self.device, dims=model_dims(self.module))
        return Plan(choice.value, dtype_name(choice.value), choice.reason, slow_bf16_note(choice.value, self.device),
                    int8_product=forward_int8_product() if choice.value == INT8 else None)

    def why_not_int8(self) -> str | None:
        """None where precision=int8 runs here (on the CPU, with torch's fbgemm int8 products), else the
        sentence saying why not (what sampling_plan and scoring_plan raise for it)."""
        return why_not_int8(self.device)

    def measure_threads(self, plan: Plan) -> str | None:
        """On the CPU with the step sampler: torch's thread count set to the faster of its current count and
        1 for this plan's decoding step, timed (sampling.threads.choose_threads; imagegen-sample's threads=0).
        Returns the line saying what was measured, or None (nothing measured)."""
        if self.device.type != "cpu" or plan.sampler != "step":
            return None
        return choose_threads(self.module, plan.batch, plan.dtype)[1]

    def generate(self, n: int | None = None, labels: Labels = None, temperature: float = 1.0,
                 guidance: float | None = None, seed: int = 0, precision: str = "auto", batch_size: int = 64,
                 progress: bool = False, sampler: str = "auto", plan: Plan | None = None) -> np.ndarray:
        """Sample new images.

        Args:
            n: how many (default: the labels' count, else 16).
            labels: one class (number or name) for all, or one per image; None: p(x | no label).
            temperature: sharpens (< 1) or flattens (> 1) the model's distribution.
            guidance: classifier-free guidance; None takes the model's default.
            seed: the draws' seed (the same seed, the same bytes).
            precision: the products' precision, auto (imagegen-sample's default), float32, bfloat16 or int8
                (see sampling_plan).
            batch_size: images drawn at a time.
            progress: show a progress bar.
            sampler: auto, step or recompute (see sampling_plan).
            plan: a sampling_plan(n, ...) made beforehand; it replaces precision, batch_size and sampler.

        Returns:
            (N, H, W, C) uint8 images.
        """
        self._fit_threads()
        labels = self._labels(labels)
        n = n if n is not None else (len(labels) if labels is not None and len(labels) > 1 else 16)
        check_sampling(n=n, batch_size=batch_size, temperature=temperature, guidance=guidance, seed=seed)
        check_images_fit(self.info, n, f"n={n:,}")
        plan = plan or self.sampling_plan(n, precision, batch_size, sampler)
        seqs = generate(self.module, n, sampler=plan.sampler, temperature=temperature, seed=seed,
                        batch_size=plan.batch, labels=labels, guidance=self.guidance if guidance is None else guidance,
                        dtype=plan.dtype, progress=progress, desc=f"{plan.loop} sampling")
        return to_images(seqs, self.info)

    def complete(self, images: np.ndarray, rows: int | None = None, n: int = 1, labels: Labels = None,
                 temperature: float = 1.0, guidance: float | None = None, seed: int = 0, precision: str = "auto",
                 batch_size: int = 64, progress: bool = False, sampler: str = "auto",
                 plan: Plan | None = None) -> np.ndarray:
        """Keep the top rows of images and sample the rest n times each.

        Args:
            images: (B, H, W, C) uint8.
            rows: the image rows kept (default: half).
            n: completions per image.
            labels: the images' classes (one for all, or one per image); a class-conditional model
                without them completes from p(x | no label).
            temperature, guidance, seed, precision, batch_size, progress, sampler: as in `generate`.
            plan: a sampling_plan(B * n, ...) made beforehand; it replaces precision, batch_size and sampler.

        Returns:
            (B, n, H, W, C) uint8 (model.grid tiles it, a row per image).
        """
        self._fit_threads()
        check_sampling(n=n, batch_size=batch_size, temperature=temperature, guidance=guidance, seed=seed)
        images = self._images(images)
        check_images_fit(self.info, len(images) * n, f"{len(images):,} images x n={n:,}")
        keep = self._rows(rows) * self.info.width * self.info.channels
        prefix = torch.from_numpy(images.reshape(len(images), -1)[:, :keep]).repeat_interleave(n, dim=0)
        labels = self._labels(labels, len(images))
        if labels is not None:
            labels = labels.repeat_interleave(n)
        plan = plan or self.sampling_plan(len(prefix), precision, batch_size, sampler)
        seqs = generate(self.module, len(prefix), prefix=prefix, sampler=plan.sampler, temperature=temperature,
                        seed=seed, batch_size=plan.batch, labels=labels,
                        guidance=self.guidance if guidance is None else guidance, dtype=plan.dtype,
                        progress=progress, desc=f"{plan.loop} completing")
        return to_images(seqs, self.info).reshape(len(images), n, *images.shape[1:])

    def scoring_draws(self, lsh_draws: int) -> int:
        """The hash draws bits_per_dim averages over: lsh_draws for a model with LSH attention, else 1."""
        return lsh_draws if any(b.attn.name == "lsh" for b in self.module.blocks) else 1

    def bits_per_dim(self, images: np.ndarray, labels: Labels = None, batch_size: int = 32,
                     precision: str = "float32", lsh_draws: int = 1, lsh_seed: int = 0, progress: bool = False,
                     world: World | None = None, plan: Plan | None = None, quiet: bool = False) -> float:
        """Exact bits/dim of images under p(x | label), the NLL summed in float64 (imagegen-eval's figure).

        Args:
            images: (B, H, W, C) uint8.
            labels: for a class-conditional model, one per image or one for all; without them such a
                model scores p(x | no label), and says so in one line on stderr (quiet: not).
            batch_size: images scored at a time.
            precision: float32 (imagegen-eval's default), bfloat16, auto or int8 (see scoring_plan).
            lsh_draws, lsh_seed: LSH attention: the NLL averaged over lsh_draws seeded hash draws, the first
                seeded lsh_seed.
            progress: show a progress bar.
            world: under torchrun, the processes sharing the images (imagegen.world.World): each scores its
                shard and the float64 sums are added, so any world size gives the same figure.
            plan: a scoring_plan(...) made beforehand; it replaces precision.

        Returns:
            The mean bits per sub-pixel.
        """
        self._fit_threads()
        check_sampling(batch_size=batch_size, lsh_draws=lsh_draws)
        whole(lsh_seed, "lsh_seed", 0)
        images = self._images(images)
        labels = self._labels(labels, len(images))
        if labels is None and self.module.num_classes and not quiet:
            say("bits_per_dim scored p(x | no label): this model is class-conditional; pass labels=... (one per "
                "image) to score p(x | label).")
        plan = plan or self.scoring_plan(precision)
        x = torch.from_numpy(images.reshape(len(images), -1))
        lsh = [b.attn for b in self.module.blocks if b.attn.name == "lsh"]
        draws = self.scoring_draws(lsh_draws)
        seeds = [attn.eval_seed for attn in lsh]
        nats = []
        try:
            for draw in range(draws):                        # LSH: the NLL averaged over seeded hash draws
                for attn in lsh:
                    attn.eval_seed = lsh_seed + draw
                with autocast(self.device, plan.dtype == torch.bfloat16), int8_forward(self.module, plan.dtype):
                    nats.append(total_nll(self.module, x, batch_size, self.device, progress=progress,
                                          desc=f"scoring, draw {draw + 1}/{draws}" if lsh else "scoring",
                                          world=world or World(), labels=labels))
        finally:
            for attn, seed in zip(lsh, seeds):
                attn.eval_seed = seed
        return sum(nats) / len(nats) / (x.numel() * LN2)

    def load_split(self, split: str = "test", n: int | None = None, root: str | None = None,
                   download: bool | None = None, mirror: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """A split of the dataset this model was trained on, read as the commands read it.

        Args:
            split: test, val or train.
            n: only the first n images.
            root: the data folder; None: the model's recorded data root (a shipped model:
                $IMAGEGEN_DATA/<name>, else data/<name>).
            download: None keeps the model's setting (True fetches missing official files).
            mirror: base URL of a mirror of the official files; None keeps the model's.

        Returns:
            (images (N, H, W, C) uint8, labels (N,) int64).
        """
        if n is not None:
            check_sampling(n=n)
        ((x, y),) = load_from_config(self.config["data"], (split,),
                                     {"root": root, "download": download, "mirror": mirror}, labels=True)
        count = len(x) if n is None else min(n, len(x))
        # a folder gives source.ImageRows over its cache: one uint8 tensor per index
        seqs = x[:count] if isinstance(x, torch.Tensor) else torch.stack([x[i] for i in range(count)])
        return to_images(seqs, self.info).copy(), torch.as_tensor(y[:count]).numpy().astype(np.int64)

    def grid(self, images: np.ndarray, nrow: int | None = None, scale: int = 4, originals: np.ndarray | None = None,
             rows: int | None = None, row_names: Sequence[str] | None = None, pad: int = 2) -> Image:
        """Tile images into one picture.

        Args:
            images: (B, H, W, C) uint8, or complete's result (B, n, H, W, C), a row per original.
            nrow: tiles per row (default 8; for complete's result, n, or n + 2 with originals).
            scale: how many times each pixel is enlarged.
            originals: with complete's result, the (B, H, W, C) images completed: each row then shows the
                original with its sampled rows grey, its n completions and the original whole.
            rows: with originals, the image rows complete kept (default: half, as complete's).
            row_names: a name for each row of tiles, written on its left.
            pad: the white border between and around tiles, in pixels before scaling.

        Returns:
            A PIL image.
        """
        images = self._images(images, completions=True)
        if originals is not None:
            originals = self._images(originals)
            if images.ndim != 5 or len(originals) != len(images):
                raise UserError(f"originals must be the {len(originals)} images complete's result "
                                f"(B, n, H, W, C) completed, one per row, got a result of shape {images.shape}; "
                                f"pass model.complete(originals, ...)'s result.")
            nrow = images.shape[1] + 2 if nrow is None else nrow
            images = completion_rows(originals, images, self._rows(rows))
        if images.ndim == 5:
            nrow = images.shape[1] if nrow is None else nrow
            images = images.reshape(-1, *images.shape[2:])
        nrow = 8 if nrow is None else nrow
        check_sampling(nrow=nrow, scale=scale)
        whole(pad, "pad", 0)
        check_grid_fits(self.info, len(images), nrow, scale)
        picture = grid(images, nrow=nrow, scale=scale, pad=pad)
        if row_names is None:
            return picture
        tile_rows = -(-len(images) // min(nrow, len(images)))
        if isinstance(row_names, str) or len(row_names) != tile_rows:
            raise UserError(f"row_names must hold one name per row of tiles ({tile_rows}), got {shown(row_names)}.")
        return name_rows(picture, [str(name) for name in row_names])

    @property
    def sampler(self) -> str:
        """How this model samples: step (an RNN or KV cache) or recompute (LSH)."""
        return resolve_sampler(self.module, "auto")

    def _images(self, images, completions=False):
        """images as (N, H, W, C) uint8 of this model's shape (N > 0; (N, H, W) for one channel; whole numbers
        of any numeric type); completions: complete's (B, n, H, W, C) too, kept 5-D."""
        shape = (self.info.height, self.info.width, self.info.channels)
        want = f"(N, {shape[0]}, {shape[1]}, {shape[2]}) uint8{' or (B, n, ...) from complete' if completions else ''}"
        try:
            array = np.asarray(images)
        except (ValueError, TypeError):                 # ragged nested lists
            array = np.empty(0, object)
        if not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array):
            raise UserError(f"images must be a numpy array {want}, got {shown(images)}; pass pixels 0..255, "
                            f"e.g. model.generate(...)'s result.")
        if array.dtype != np.uint8:
            bad = array[~np.isin(array, np.arange(256))]
            if bad.size:
                raise UserError(f"images must hold whole numbers in 0..255 (uint8 pixels), got {array.dtype} values "
                                f"such as {bad.flat[0]}; scale them to 0..255 and round, e.g. "
                                f"np.round(images * 255).astype(np.uint8).")
        array = np.ascontiguousarray(array, dtype=np.uint8)
        if array.ndim == 3 and self.info.channels == 1:
            array = array[..., None]
        if not (array.ndim == 4 or completions and array.ndim == 5) or array.shape[-3:] != shape:
            raise UserError(f"images must be {want}, got {array.shape}.")
        if not array.size:
            raise UserError(f"images holds no image (shape {array.shape}); pass at least one, {want}.")
        return array

    def _rows(self, rows):
        """The image rows a completion keeps: rows, checked, or half the height for None."""
        return whole(self.info.height // 2 if rows is None else rows, "rows", 0, self.info.height)

    def _labels(self, labels, n=None):
        """labels (class numbers or names: config.class_numbers) as (N,) long, None staying None; n: the
        images they label (one label is repeated n times)."""
        if labels is None:
            return None
        labels = torch.tensor(class_numbers(labels, self.class_names), dtype=torch.long)
        if n is not None and len(labels) == 1:
            labels = labels.expand(n)
        if n is not None and len(labels) != n:
            raise UserError(f"give one label per image (or one for all): {n} images but {len(labels)} labels.")
        return labels
