"""Typed configuration (schema.py: every option's type, default and help sentence, imagegen-bench's in
bench.py, registered with Hydra by registry.py) and the checks of a composed config (checks.py). This face
only re-exports."""
from .checks import (MAX_SEED, attention_options, composed, check_classes, check_device, check_eval, check_model,
                     check_sample, check_sampling, check_threads, check_train, class_numbers, fits, fraction,
                     full_attention_options, positive, shown, unknown_option, whole)
from .bench import BenchConfig
from .schema import (ACTIVATIONS, ATTENTION_OPTIONS, CheckpointCommand, ConvertConfig,
                     DataConfig, DataOverride, EvalConfig, ExportConfig, LinearOptions, LSHOptions, ModelConfig,
                     PackConfig, PlotConfig, PrepareConfig, SampleConfig, SoftmaxOptions, TrainConfig, TrainOptions,
                     UnpackConfig, opt)
from .registry import SCHEMAS, describe, options, register, sections, type_name
from .typed import plain, typed

__all__ = ["ACTIVATIONS", "attention_options", "ATTENTION_OPTIONS", "BenchConfig", "check_classes", "check_device",
           "composed", "check_eval", "check_model", "check_sample", "check_sampling", "check_threads", "check_train",
           "CheckpointCommand", "class_numbers", "ConvertConfig", "DataConfig", "DataOverride", "describe",
           "EvalConfig", "ExportConfig", "fits", "fraction", "full_attention_options", "LinearOptions", "LSHOptions",
           "MAX_SEED", "ModelConfig", "opt", "options", "PackConfig", "plain", "PlotConfig", "positive",
           "PrepareConfig", "register", "SampleConfig", "SCHEMAS", "sections", "shown", "SoftmaxOptions",
           "TrainConfig", "TrainOptions", "type_name", "typed", "unknown_option", "UnpackConfig", "whole"]
