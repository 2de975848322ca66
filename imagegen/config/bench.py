"""imagegen-bench's typed options: those every mode shares at the top, and each mode's own in a section of its
own (speedrun.*, sampling.*, ...), as schema.py types every other command's."""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .schema import DataConfig, DataOverride, ModelConfig, TrainOptions, opt


@dataclass
class SpeedrunOptions:
    """imagegen-bench mode=speedrun (benchmarks/speedrun.py, docs/speedrun.md)."""
    preset: str = opt("cpu_mnist", "the training preset the runs start from (conf/preset/)")
    change: str = opt("baseline", "the row's name in the record table: what this recipe changes")
    overrides: List[str] = opt([], "imagegen-train overrides of the recipe, e.g. [train.optimizer=muon,"
                                   "'model.context=[2,27,28,29,56]']")
    target: Optional[float] = opt(None, "validation bits/dim to reach (null: 1.00 for mnist, 4.50 for cifar10)")
    budgets: List[float] = opt([45.0], "CPU-minute budgets tried in order until a run reaches the target (the "
                                       "record: the smallest that does)")
    threads: int = opt(1, "torch threads of each run (the record is timed at 1)")
    val_every: int = opt(50, "validate every this many steps (the time to target is read at validations)")
    val_images: Optional[int] = opt(None, "held-out images per validation (null: 2,000 for mnist, else 1,000)")
    test_images: int = opt(2000, "test bits/dim of each run's best.pt over the first N test images (0: none)")
    record: str = opt("docs/speedrun.json", "the JSON file of every run's row; the table is written beside it (.md)")
    kept: Optional[bool] = opt(None, "the row's verdict after its A/B: true (kept in the recipe), false (dropped), "
                                     "null (pending)")
    load: str = opt("", "what else ran on the machine meanwhile, for the table (e.g. 'other core: tests')")


@dataclass
class Timed:
    """What attention and train_step share: the linear attention's variants and the repetitions."""
    feature_maps: List[str] = opt(["elu"], "the linear attention's feature maps, each NAME[:N_FEATURES][+gate], e.g. "
                                           "[elu, favor:64, favor:128, rff, elu+gate]")
    repeat: int = opt(3, "timed repetitions")


@dataclass
class AttentionBenchOptions(Timed):
    """imagegen-bench mode=attention: the causal attention alone, forward and forward+backward."""
    lengths: List[int] = opt([784, 3072, 8192, 16384], "sequence lengths")
    batch: int = opt(4, "batch size")
    heads: int = opt(8, "heads")
    head_dim: int = opt(32, "head dim E = M")
    impls: List[str] = opt(["softmax", "cumsum", "chunked", "kernel", "triton", "auto"],
                           "implementations (triton: CUDA only)")
    dtypes: List[str] = opt(["float32"], "float32 and/or bfloat16")
    cumsum_max_gb: float = opt(12.0, "skip cumsum where its states would exceed this")


@dataclass
class TrainStepOptions(Timed):
    """imagegen-bench mode=train_step: the whole model's training step, softmax against linear."""
    batch: int = opt(16, "batch size")
    lengths: Dict[str, int] = opt({"mnist": 784, "cifar10": 3072}, "length per dataset")
    precisions: List[str] = opt(["float32", "auto"], "float32, bfloat16 (autocast), auto (bfloat16 where fast)")


@dataclass
class SamplingOptions:
    """imagegen-bench mode=sampling (images/sec of each sampler); compare and paper time their samplers with
    step_batches, recompute_batches, n_positions, reps and max_cache_gb too."""
    methods: List[str] = opt(["linear-recurrent", "softmax-kv-cache", "softmax-recompute", "lsh-recompute"],
                             "samplers to time")
    step_batches: List[int] = opt([1, 16, 64, 256], "batch sizes of the step samplers")
    recompute_batches: List[int] = opt([1, 4], "batch sizes of the recompute samplers")
    max_cache_gb: float = opt(8.0, "skip KV-cache batch sizes whose cache would exceed this")
    n_positions: int = opt(9, "positions timed, then integrated over all D")
    probe_positions: List[int] = opt([100, 3000], "positions whose latency ratio is reported")
    reps: int = opt(5, "timed steps per position")
    precisions: List[str] = opt(["float32", "auto"], "precisions of the matrix products (float32, bfloat16, auto: "
                                                     "bfloat16 where fast (its random weights record no int8 "
                                                     "cost); int8: 8-bit Dense weights, CPU)")
    plot_batch: int = opt(64, "batch size of the latency plot (or the nearest measured one)")
    plot_log: bool = opt(False, "log-scale ms axis in the latency plot")
    lsh_options: Dict[str, Any] = opt({"n_hashes": 1, "n_buckets": 64, "chunk_size": 32}, "LSH options")


@dataclass
class CompareOptions:
    """imagegen-bench mode=compare: the paper's table for trained checkpoints."""
    checkpoints: List[str] = opt([], "checkpoints to put in the table")
    split: str = opt("test", "split to evaluate")


@dataclass
class BrowserOptions:
    """imagegen-bench mode=browser: the exported page's step in headless Chromium beside Python's."""
    batches: List[int] = opt([1, 16], "batch sizes (random weights of the preset, linear attention)")
    steps: int = opt(100, "timed steps per measurement (after 10 warm-up steps)")
    rounds: int = opt(3, "alternating Python / browser rounds; medians reported")


@dataclass
class PaperOptions:
    """imagegen-bench mode=paper: every attention trained alike, then test bits/dim against images/sec."""
    attentions: List[str] = opt(["softmax", "linear", "lsh", "lsh4"], "the attentions to train and compare, named "
                                                                      "as model= names them (conf/model/)")
    budget: str = opt("minutes", "each attention's training budget: minutes (equal minutes each) or steps")
    minutes: float = opt(30.0, "paper.budget=minutes: minutes of training per attention")
    steps: int = opt(2000, "paper.budget=steps: optimizer steps per attention")
    jobs: int = opt(0, "training processes at once (0: one per CPU core this process may use; never more than "
                       "those cores)")


@dataclass
class ProbesOptions:
    """imagegen-bench mode=probes: the cached speed verdicts of the auto settings and why each is trusted."""
    clear: bool = opt(False, "remove the cached verdicts (each is timed again when next needed)")


@dataclass
class BenchConfig:
    """imagegen-bench: the options every mode shares, then one section per mode (sampling.step_batches=...)."""
    mode: str = opt("sampling", "attention, train_step, sampling, compare, browser, paper, speedrun or probes")
    overwrite: bool = opt(False, "replace a table, JSON or plot in out_dir that imagegen did not write there or that "
                                 "changed since (refused before anything is measured without it)")
    out_dir: str = opt("bench", "folder for the Markdown tables, JSON and plots")
    arch_name: str = opt("paper_mnist", "label of the architecture in the tables (the preset's name)")
    device: str = opt("cpu", "cpu (or cuda where the mode supports it)")
    threads: int = opt(0, "CPU threads for torch (0: as many as there are cores free at start)")
    seed: int = opt(0, "seed of the random weights and inputs")
    quick: bool = opt(False, "attention, train_step, sampling: a run of about a minute on 2 cores (fewer cases); "
                             "paper: the whole pipeline in about two minutes (a tiny model, a few steps each, "
                             "a small test subset)")
    max_images: Optional[int] = opt(None, "compare and paper: bits/dim over the first N images of the split "
                                          "(null: all)")
    eval_data: DataOverride = field(default_factory=DataOverride)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    attention: AttentionBenchOptions = field(default_factory=AttentionBenchOptions)
    train_step: TrainStepOptions = field(default_factory=TrainStepOptions)
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    compare: CompareOptions = field(default_factory=CompareOptions)
    browser: BrowserOptions = field(default_factory=BrowserOptions)
    paper: PaperOptions = field(default_factory=PaperOptions)
    speedrun: SpeedrunOptions = field(default_factory=SpeedrunOptions)
    probes: ProbesOptions = field(default_factory=ProbesOptions)
    # the presets set train.* too; only mode=paper reads it, passing it on to imagegen-train (whose --help
    # lists it), so --help does not list it here
    train: TrainOptions = field(default_factory=TrainOptions, metadata={"hidden": True})
