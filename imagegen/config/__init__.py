"""Typed configuration (schema.py: every option's type, default and help sentence, registered with
Hydra) and the checks of a composed config (checks.py). This face only re-exports."""
from .checks import (attention_options, check_classes, check_eval, check_model, check_sample,  # noqa: F401
                     check_sampling, check_threads, check_train, fits, fraction, full_attention_options, positive,
                     unknown_option)
from .schema import (ATTENTION_OPTIONS, SCHEMAS, BenchConfig, CheckpointCommand, ConvertConfig,  # noqa: F401
                     DataConfig, DataOverride, EvalConfig, ExportConfig, LinearOptions, LSHOptions, ModelConfig,
                     PlotConfig, PrepareConfig, SampleConfig, SoftmaxOptions, TrainConfig, TrainOptions, describe,
                     opt, register, type_name)
