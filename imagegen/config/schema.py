"""Typed configuration: one place for the type, default meaning and help sentence of every option.

The dataclasses below are registered in Hydra's ConfigStore as schemas (`<name>_schema`) that the
YAML files in conf/ extend, so a value of the wrong type fails at the command line (`model.n_layers=four`)
and `--help` prints every option with its sentence. Ranges (positive sizes, lr > 0, ...) are
checked by `check_*` before anything heavy starts. These dataclasses are the one source of defaults: the
YAML files in conf/ hold only the config groups, presets and what needs an interpolation.
"""
from dataclasses import MISSING, dataclass, field
from typing import Any, Dict, List, Optional



def opt(default, help, example=None, **kw):
    """A dataclass field with its one-sentence help; a required one (default MISSING) with an example value,
    which --help shows in place of Hydra's ???."""
    metadata = {"help": help, **({"example": example} if example else {})}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, **kw)
    return field(default=default, metadata=metadata, **kw)


@dataclass
class LinearOptions:
    """model.attention_options of the linear attention (attention/linear.py, feature_maps.py, docs/feature-maps.md)."""
    impl: str = opt("auto", "how the attention is computed, not part of the architecture: auto (the fastest here), "
                            "kernel (fused C++), triton (CUDA), chunked, cumsum or reference")
    feature_map: str = opt("elu", "phi of queries and keys: elu (elu + 1), relu, favor (Performer's FAVOR+ random "
                                  "features) or rff (random Fourier features)")
    n_features: Optional[int] = opt(None, "favor and rff: the number of random features F (rff: even; null: 64)")
    redraw_every: int = opt(0, "favor and rff: a new random draw every this many training forwards (0: never)")
    gate: str = opt("none", "recency gate of the sums: none, head (one learned decay per head) or input (a decay "
                            "per head and position from the layer's input)")


@dataclass
class LSHOptions:
    """model.attention_options of the Reformer LSH attention (attention/lsh.py)."""
    n_hashes: int = opt(1, "hashing rounds, combined by their log-sum-exp weights")
    n_buckets: int = opt(64, "hash buckets per round (even, at least 2)")
    chunk_size: int = opt(32, "a query attends to at most this many of the most recent earlier positions of its bucket")
    eval_seed: int = opt(0, "seed of the hash rotations in eval mode, so that validation is reproducible "
                            "(imagegen-eval draws with its own lsh_seed)")


@dataclass
class SoftmaxOptions:
    """The softmax attention takes no options."""


# each attention's options, by its name (model.attention); the attention classes hold them as `Options`
ATTENTION_OPTIONS = {"linear": LinearOptions, "lsh": LSHOptions, "softmax": SoftmaxOptions}
ACTIVATIONS = ("gelu", "relu2")                 # model.activation's names (model/transformer.py builds them)


@dataclass
class ModelConfig:
    attention: str = opt("linear", "attention of every layer: linear (an RNN when sampling), softmax or lsh")
    attention_options: Dict[str, Any] = opt({}, "the options of the attention model= picks, set without a +: "
                                                "model.attention_options.KEY=VALUE (each attention's are listed "
                                                "below)")
    n_layers: int = opt(4, "number of transformer blocks")
    d_model: int = opt(128, "width of the residual stream (a multiple of n_heads)")
    n_heads: int = opt(4, "attention heads per layer")
    d_ff: int = opt(512, "hidden width of each block's feed-forward layer")
    activation: str = opt("gelu", "the feed-forward's nonlinearity: gelu, or relu2 (relu squared); the sampler's "
                                  "one-call C++ step and the browser page run gelu only")
    head: str = opt("categorical", "output distribution: categorical (256-way) or mixture (discretized logistics)")
    n_mixtures: int = opt(10, "logistic components of the mixture head")
    dropout: float = opt(0.0, "dropout rate in the blocks (0 to 1)")
    num_classes: int = opt(0, "class-conditional model over this many classes (the data's: 10 for mnist, "
                              "fashion_mnist and cifar10, 100 for cifar100); 0: unconditional")
    context: List[int] = opt([], "sub-pixel distances (>= 2) whose bytes each add a learned embedding at every "
                                 "position (the input byte is distance 1), e.g. [2,3,96] for 32-wide colour: the "
                                 "pixel's earlier channel, one pixel left, one row up; [] none (docs/recipe.md)")


@dataclass
class DataConfig:
    name: str = opt("mnist", "dataset: mnist, fashion_mnist, cifar10, cifar100, folder, imagenet32 or imagenet64")
    root: str = opt("data/mnist", "folder holding the set's files (MNIST/raw, FashionMNIST/raw, cifar-10-batches-py, "
                                  "cifar-100-python, ...), or the folder of images (data=folder); made absolute when "
                                  "a run starts")
    download: bool = opt(True, "fetch the official files (md5-checked) when they are missing; false: never download")
    mirror: Optional[str] = opt(None, "base URL holding the official files under their names (null: the official URLs)")
    val_fraction: float = opt(0.05, "seeded share of the training files held out for validation (0 to 1)")
    split_seed: int = opt(0, "seed of the train/validation split")
    # data=folder (imagegen/data/source.py, docs/data.md)
    image_size: Optional[int] = opt(None, "folder: side S of the square images the folder's images become (or give "
                                          "height and width)")
    height: Optional[int] = opt(None, "folder: image height in pixels (with width; instead of image_size)")
    width: Optional[int] = opt(None, "folder: image width in pixels (with height; instead of image_size)")
    channels: Optional[int] = opt(None, "folder: 1 (grey) or 3 (colour)")
    fit: str = opt("crop", "folder: crop (resize the shorter side, cut the centre) or pad (resize the longer side, "
                           "pad with the background)")
    background: int = opt(255, "folder: grey level 0..255 under transparent pixels and in the padding")
    test_fraction: float = opt(0.1, "folder without test/ or val/ subfolders: seeded share held out as the test split")
    workers: int = opt(0, "folder: processes converting the images into the cache (0: one per CPU core)")
    cache: Optional[str] = opt(None, "folder: where the converted images live (null: DIR/.imagegen-cache, or "
                                     "~/.cache/imagegen/... when DIR is read-only)")


@dataclass
class DataOverride:
    root: Optional[str] = opt(None, "dataset folder; null keeps the one stored in the checkpoint")
    download: Optional[bool] = opt(None, "fetch missing files; null keeps the checkpoint's setting")
    mirror: Optional[str] = opt(None, "base URL of a mirror of the official files; null keeps the checkpoint's")


@dataclass
class TrainOptions:
    batch_size: int = opt(16, "images per optimizer step (more than fit in memory: one sentence)")
    optimizer: str = opt("adamw", "adamw, adam, radam, or muon (torch.optim.Muon for the blocks' matrices, AdamW for "
                                  "the rest; training/optim.py)")
    lr: float = opt(1e-3, "peak learning rate, reached after warmup_steps")
    muon_lr: Optional[float] = opt(None, "optimizer=muon: the blocks' matrices' peak learning rate (null: lr; Muon's "
                                         "steps are scaled to AdamW's size, so the same lr suits both)")
    muon_momentum: float = opt(0.95, "optimizer=muon: Muon's (Nesterov) momentum")
    zero_init: bool = opt(False, "start every block's output projections and the head at zero (each block the "
                                 "identity, the model the uniform distribution)")
    target_bpd: Optional[float] = opt(None, "stop once a validation reaches this bits/dim (null: train the whole "
                                            "budget); imagegen-bench mode=speedrun times runs to it")
    betas: List[float] = opt([0.9, 0.98], "Adam's two decay rates")
    weight_decay: float = opt(0.0, "decoupled weight decay (adamw) or L2 penalty")
    warmup_steps: int = opt(100, "steps of linear warmup before the decay")
    decay: str = opt("cosine", "the decay after warmup to lr * min_lr_ratio at the budget's end: cosine or linear")
    min_lr_ratio: float = opt(0.0, "the decay ends at lr * min_lr_ratio")
    grad_clip: float = opt(1.0, "clip the gradient norm to this (0: no clipping)")
    max_steps: int = opt(100000, "stop after this many optimizer steps")
    max_minutes: Optional[float] = opt(None, "stop after this many minutes of training (null: no time budget); "
                                             "the decay follows whichever budget runs out first")
    clock: str = opt("wall", "what train.max_minutes and the logged minutes count in training steps: wall (the "
                             "wall clock) or cpu (this process's CPU time: its own work on a shared machine, "
                             "for threads=1; imagegen-bench mode=paper uses it)")
    val_every: int = opt(500, "validate (bits/dim on val_images) every this many steps")
    val_images: int = opt(500, "validation images per validation")
    save_every: int = opt(100, "write last.pt every this many steps (and at the end, and on Ctrl-C/SIGTERM)")
    log_every: int = opt(10, "write a metrics row (and TensorBoard scalars) every this many steps")
    sample_every: int = opt(500, "save a grid of samples (PNG in run_dir/samples, TensorBoard) every this many "
                                 "steps (0: never)")
    sample_minutes: float = opt(5.0, "also save a grid every this many minutes of training (0: only by steps), so "
                                     "that a slow run shows its progress too")
    sample_images: int = opt(16, "images in each grid of samples during training")
    label_dropout: float = opt(0.1, "class-conditional models: share of training images shown without their label, "
                                    "so that the model also samples unconditionally (guidance needs it)")
    ema: float = opt(0.0, "decay of an exponential moving average of the weights, which validation, best.pt and "
                          "sampling then use (0: off; 0.999 averages over about the last 1,000 steps)")
    tensorboard: Any = opt("auto", "TensorBoard event files in run_dir: auto (when the tensorboard package is "
                                   "installed), true or false")
    init: Optional[str] = opt(None, "start a new run from these weights instead of random ones: a .pt checkpoint, "
                                    "a .safetensors model or a shipped name (mnist-linear); the model settings must "
                                    "be its own (model.context may add distances); a resumed run keeps its own weights")
    resume: bool = opt(True, "continue from run_dir/last.pt when it exists")
    overwrite: bool = opt(False, "with resume=false, start over in a run_dir that holds checkpoints (the old run's "
                                 "files are moved into run_dir/previous-<time>/)")
    bf16: Any = opt("auto", "bfloat16 autocast: auto (where the hardware multiplies bfloat16 fast), true or false")
    progress: bool = opt(True, "show a progress bar (false: a one-line log every 30 s instead)")


@dataclass
class TrainConfig:
    run_dir: str = opt("checkpoints/run", "folder for last.pt, best.pt and metrics.jsonl")
    seed: int = opt(0, "seed of the initial weights, the data order and the RNG")
    device: str = opt("auto", "auto (CUDA when available), cpu, cuda or cuda:N")
    threads: int = opt(0, "CPU threads for torch (0: as many as there are cores free at start, shared among "
                          "torchrun's processes, and fewer when the steps slow down sharply and fewer are free)")
    dist_timeout_s: float = opt(300.0, "seconds a torchrun process waits for the others before it stops (one died)")
    train: TrainOptions = field(default_factory=TrainOptions)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)


@dataclass
class CheckpointCommand:
    """What eval and sample share: a checkpoint, where to run, and a dataset override."""
    checkpoint: str = opt(MISSING, "a .pt checkpoint written by imagegen-train, a .safetensors model (with its .json) "
                                   "or the name of a shipped model (mnist-linear, cifar10-linear)",
                          example="mnist-linear")
    device: str = opt("auto", "auto, cpu, cuda or cuda:N")
    threads: int = opt(0, "CPU threads for torch (0: as many as there are cores free at start)")
    progress: bool = opt(True, "show a progress bar")
    data: DataOverride = field(default_factory=DataOverride)


@dataclass
class EvalConfig(CheckpointCommand):
    split: str = opt("test", "test, val or train")
    batch_size: int = opt(32, "images per forward pass (at most the images scored; more than fit in "
                                  "memory: one sentence)")
    max_images: Optional[int] = opt(None, "evaluate only the first N images (null: all)")
    lsh_draws: int = opt(1, "LSH: average the NLL over this many seeded hash draws")
    lsh_seed: int = opt(0, "LSH: seed of the first hash draw")
    precision: str = opt("float32", "float32, bfloat16 (the forward under bfloat16 autocast; sums in float64), auto "
                                    "(bfloat16 where measured faster; never int8) or int8 (CPU: the Dense layers with "
                                    "8-bit weights, one scale per output channel, activations quantized per row; "
                                    "LayerNorm, the attention's sums and the head in float32): the quantized model's "
                                    "exact bits/dim")
    labels: bool = opt(True, "class-conditional models: score each image given its label (false: without labels)")
    overwrite: bool = opt(False, "replace a result file <checkpoint stem>.<split>.json that imagegen did not write "
                                 "there or that changed since")


@dataclass
class SampleConfig(CheckpointCommand):
    checkpoint: str = opt("mnist-linear", "a .pt checkpoint written by imagegen-train, a .safetensors model (with its "
                                          ".json) or the name of a shipped model; default: mnist-linear, shipped "
                                          "with imagegen")
    mode: str = opt("grid", "grid: a grid of samples (a class-conditional model: a row per class, see labels); "
                                 "complete: keep the top half of test images, sample the rest")
    num_images: int = opt(64, "grid mode: images to sample")
    num_originals: int = opt(8, "complete mode: test images, one row each")
    completions: int = opt(5, "complete mode: samples per test image")
    row_names: bool = opt(True, "class-conditional models: write each row's class name on its left (grids with a "
                                "row per class, and completions)")
    originals: str = opt("first", "complete mode: first (the first num_originals test images) or per_class (the "
                                  "first test image of each class, one row each)")
    out: Optional[str] = opt(None, "image to write, in the format its suffix names (.png, .jpg, .webp or another "
                                   "Pillow writes; null: <checkpoint stem>-<mode>.png beside the checkpoint)")
    nrow: int = opt(8, "grid mode: images per row")
    scale: int = opt(4, "nearest-neighbour upscaling of the PNG")
    save_each: bool = opt(False, "also write each sampled image, in out's format, into the folder <out without its "
                                 "suffix>/ (0000.png, 0001.png, ...)")
    overwrite: bool = opt(False, "replace a file at out (or, with save_each, in its folder) that imagegen did not "
                                 "write there or that changed since; without it such a file is refused (what "
                                 "imagegen-sample writes is recorded by name and SHA-256 in .imagegen-outputs.json "
                                 "beside out and .imagegen-files.json in the folder, so the same command again "
                                 "replaces its own files)")
    sampler: str = opt("auto", "auto (step when the attention can, else recompute), step or recompute")
    batch_size: int = opt(64, "images sampled together (at most the images asked for; more than fit in "
                                  "memory: one sentence)")
    temperature: float = opt(1.0, "sampling temperature (> 0; 1 samples the model's distribution)")
    seed: int = opt(0, "seed of the draws")
    precision: str = opt("auto", "matrix products in float32, bfloat16 (sums, LayerNorm, the head and the draw stay "
                                 "float32), auto (int8 for a model whose recorded int8 cost is at most 0.01 bits/dim "
                                 "where its products measure faster; else bfloat16 where measured faster) or int8 "
                                 "(CPU: the Dense layers with 8-bit weights, activations quantized per row (per call "
                                 "in fbgemm's product, where the C++ kernel is not built); the rest "
                                 "float32; docs/speed.md)")
    label: Optional[int] = opt(None, "class-conditional models, grid mode: every image of this class (0..C-1)")
    labels: Any = opt("auto", "class-conditional models: a list of classes, one grid row (nrow images) each; auto: "
                              "one row per class (complete mode: each test image's own label); none: no labels")
    guidance: Optional[float] = opt(None, "classifier-free guidance G, 0 to 12 (1: the plain conditional distribution, "
                                          "> 1: more typical of the class); null: the model's recorded default, else 1")
    threads: int = opt(0, "CPU threads for torch (0: measured: the cores free at start, then a few decoding steps "
                          "are timed with that many and with 1 thread, and the faster is kept, as the output says)")


@dataclass
class ExportConfig:
    checkpoint: str = opt(MISSING, "a linear model: a .pt checkpoint written by imagegen-train, a .safetensors "
                                   "model (with its .json) or the name of a shipped model (mnist-linear, "
                                   "cifar10-linear)", example="checkpoints/run/best.pt")
    out: str = opt("site", "folder for index.html, the JavaScript sampler, model.safetensors and config.json")
    examples: int = opt(8, "test images included for the completion mode (0: none; skipped if the data is missing)")
    guidance: Optional[float] = opt(None, "class-conditional models: the page's default classifier-free guidance (1: "
                                          "none); null: the model's recorded default, else 1")
    overwrite: bool = opt(False, "replace files in out that the export did not write (a symlink is replaced, never "
                                 "written through)")
    precision: Optional[str] = opt(None, "float32, or int8: model.safetensors with each Dense layer's weight in 8 bits "
                                         "and a float32 scale per output column, which the page turns back into "
                                         "float32 (about a quarter of the download); null: the checkpoint's (int8 "
                                         "for a model converted with precision=int8)")
    device: str = opt("cpu", "where the checkpoint is read (the page itself runs in the browser)")
    threads: int = opt(0, "CPU threads for torch (0: as many as there are cores free at start)")
    data: DataOverride = field(default_factory=lambda: DataOverride(download=False))


@dataclass
class ConvertConfig:
    checkpoint: str = opt(MISSING, "a .pt checkpoint written by imagegen-train (its averaged weights when it has them)",
                          example="checkpoints/run/best.pt")
    out: str = opt(MISSING, "path without suffix: writes OUT.safetensors and OUT.json", example="checkpoints/my-model")
    guidance: float = opt(1.0, "the classifier-free guidance imagegen-sample uses for this model by default (0 to 12)")
    check_images: int = opt(500, "score the first N test images with the converted file and record the bits/dim "
                                 "(0: skip)")
    batch_size: int = opt(32, "images per forward pass of the check")
    precision: str = opt("float32", "float32, or int8: each Dense layer's weight stored in 8 bits with a float32 scale "
                                    "per output column (about a quarter of the size; embeddings, LayerNorms and "
                                    "biases stay float32); it loads as float32 weights q * scale, which the check "
                                    "scores")
    keep_root: bool = opt(True, "record the data root (data.root, null: the checkpoint's) in OUT.json, made absolute, "
                                "where eval, sample mode=complete and export then find the data; false: leave it "
                                "empty, for a model to ship (it looks in $IMAGEGEN_DATA/<name> or data/<name>)")
    device: str = opt("cpu", "where the check runs")
    threads: int = opt(0, "CPU threads for torch (0: as many as there are cores free at start)")
    progress: bool = opt(True, "show a progress bar")
    overwrite: bool = opt(False, "replace OUT.safetensors or OUT.json that imagegen did not write there or that "
                                 "changed since (never a model shipped with imagegen)")
    data: DataOverride = field(default_factory=DataOverride)


@dataclass
class PlotConfig:
    runs: Any = opt([], "run folders of imagegen-train (each holds metrics.jsonl): runs=DIR or runs=[A,B]")
    out: Optional[str] = opt(None, "PNG to write (null: curves.png in the runs' common folder)")
    log: bool = opt(False, "log-scale bits/dim axes")
    overwrite: bool = opt(False, "replace a file at out that imagegen did not write there (a symlink is replaced, "
                                 "never written through)")


@dataclass
class PrepareConfig:
    check: bool = opt(False, "only say whether the cache is up to date (exit status 1 when not); build nothing")
    grid: Optional[str] = opt(None, "PNG of real images as the model sees them (null: grid.png in the cache folder, or "
                                    "the current folder for the standard sets)")
    grid_images: int = opt(64, "images in the grid (from the training split)")
    nrow: int = opt(8, "images per row of the grid")
    scale: int = opt(2, "nearest-neighbour upscaling of the grid")
    progress: bool = opt(True, "show the conversion's progress bar")
    overwrite: bool = opt(False, "replace a file at grid that imagegen did not write there (a symlink is replaced, "
                                 "never written through)")
    threads: int = opt(0, "processes converting a folder's images when data.workers is 0 (0: one per CPU core)")
    data: DataConfig = field(default_factory=DataConfig)


@dataclass
class PackConfig:
    run_dir: str = opt(MISSING, "the run folder to pack (imagegen-train's run_dir, holding last.pt)")
    out: str = opt(MISSING, "a new or empty folder for the pack: manifest.json and part-K-of-N.bin")
    state: str = opt("exact", "exact (last.pt bit for bit: the resumed run is the run never moved) or compact (the "
                              "optimizer's moments in bfloat16: a third smaller for Adam, lossy; docs/runs.md)")
    best: str = opt("weights", "best.pt as weights (its optimizer state left out: nothing resumes from best.pt), full "
                               "or none (left behind)")
    max_files: int = opt(8, "at most this many files, the manifest included (refused, nothing written, past it)")
    max_file_mib: float = opt(16.0, "at most this many MiB per file")
    overwrite: bool = opt(False, "replace an earlier pack in out (never other files)")


@dataclass
class UnpackConfig:
    pack: str = opt(MISSING, "the pack's folder (manifest.json and its part-K-of-N.bin files)")
    run_dir: str = opt(MISSING, "a new or empty folder to unpack the run into; imagegen-train run_dir=... resumes it")
    overwrite: bool = opt(False, "unpack into a run_dir that holds a run, whose files are first moved into "
                                 "run_dir/previous-<time>/")

