"""The typed configs in Hydra's ConfigStore (`register`) and listed for --help (`describe`, `options`)."""
from dataclasses import MISSING, fields, is_dataclass

from .bench import BenchConfig
from .schema import (ATTENTION_OPTIONS, ConvertConfig, EvalConfig, ExportConfig, PackConfig, PlotConfig, PrepareConfig,
                     SampleConfig, TrainConfig, UnpackConfig)

SCHEMAS = {"train": TrainConfig, "eval": EvalConfig, "sample": SampleConfig, "bench": BenchConfig,
           "plot": PlotConfig, "export": ExportConfig, "convert": ConvertConfig, "prepare": PrepareConfig,
           "pack": PackConfig, "unpack": UnpackConfig}


def register():
    """Put every schema in Hydra's ConfigStore as `<name>_schema` (the YAML files' first default), and each
    attention's options as `attention_options/<attention>` (what conf/model/<name>.yaml puts under
    model.attention_options, so that its keys are typed and set without a +)."""
    from hydra.core.config_store import ConfigStore
    cs = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        cs.store(name=f"{name}_schema", node=schema)
    for name, options in ATTENTION_OPTIONS.items():   # conf/model/*.yaml: - /attention_options/NAME@attention_options
        cs.store(group="attention_options", name=name, node=options)


def describe(schema, prefix=""):
    """[(key, type name, help)] of every option of a schema, nested sections flattened (train.lr);
    sections marked hidden (composed for the presets' sake, never read) are left out."""
    return [(key, type_name(f.type), f.metadata.get("help", "")) for key, f in options(schema, prefix)]


def options(schema, prefix=""):
    """[(key, dataclass field)] of every option of a schema, as describe lists them."""
    rows = []
    for f in fields(schema):
        if f.metadata.get("hidden"):
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if is_dataclass(default):
            rows += options(type(default), f"{prefix}{f.name}.")
        else:
            rows.append((prefix + f.name, f))
    return rows


def sections(schema):
    """{name: its docstring, on one line} of a schema's sections whose dataclass has a docstring of its own
    (imagegen-bench's modes): --help heads their options with it."""
    docs = {}
    for f in fields(schema):
        kind = f.default_factory() if f.default_factory is not MISSING else None
        doc = type(kind).__doc__ or "" if is_dataclass(kind) else ""
        if doc and not doc.startswith(type(kind).__name__ + "("):        # not the signature dataclass writes
            docs[f.name] = " ".join(doc.split())
    return docs


def type_name(t):
    return t.__name__ if isinstance(t, type) else str(t).replace("typing.", "")
