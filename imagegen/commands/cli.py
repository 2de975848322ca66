"""What every entry point shares: Hydra wiring, typed-config checks, --help, devices, one-line errors."""
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path

from .. import config
from ..errors import UserError, printable
from ..paths import data_dir

CONF_DIR = data_dir("conf")  # shipped inside the package by a wheel, else the source tree's
GROUPS = ("model", "data", "preset")      # config groups; a command takes those it names


@dataclass(frozen=True)
class Command:
    """A console script: the module whose `main` runs it, and what its --help says."""
    module: str
    description: str
    groups: tuple = ()
    examples: tuple = ()
    uses_device: bool = True       # False: the task gets no device, and torch is not imported for it
    script: str = ""               # what the user types, when not imagegen-<config name>


# Here rather than in each command's module, so that --help answers without importing torch (`launcher`).
COMMAND_TABLE = {
    "train": Command(
        "imagegen.commands.train",
        "train a pixel-level autoregressive transformer; the same command again resumes from run_dir/last.pt.",
        ("model", "data", "preset"),
        ("imagegen-train model=linear train.max_minutes=15   # MNIST in $IMAGEGEN_DATA/mnist, else data/mnist",
         "imagegen-train model=softmax data=cifar10 data.root=DIR preset=paper_cifar   # DIR holds cifar-10-batches-py",
         "torchrun --standalone --nproc_per_node=2 --no-python imagegen-train threads=1")),
    "eval": Command(
        "imagegen.commands.evaluate",
        "exact bits/dim of a checkpoint on a data split; writes <checkpoint>.<split>.json beside it.", (),
        ("imagegen-eval checkpoint=checkpoints/mnist-linear-small/best.pt",
         "imagegen-eval checkpoint=run/last.pt split=val max_images=500")),
    "sample": Command(
        "imagegen.commands.sample", "sample an image grid, or completions of test images, from a checkpoint.", (),
        ("imagegen-sample                       # the shipped mnist-linear: a row per digit",
         "imagegen-sample label=7 num_images=16 guidance=2",
         "imagegen-sample checkpoint=checkpoints/mnist-linear-small/best.pt num_images=64",
         "imagegen-sample checkpoint=run/best.pt mode=complete out=complete.png")),
    "bench": Command(
        "imagegen.commands.bench",
        "speed benchmarks (attention kernels, training step, sampling) and the paper's comparison table; "
        "Markdown tables, JSON and plots in out_dir.", ("model", "data", "preset"),
        ("imagegen-bench mode=sampling preset=paper_mnist data=mnist threads=2",
         "imagegen-bench mode=attention threads=2",
         "imagegen-bench mode=train_step preset=small threads=2",
         "imagegen-bench mode=compare compare.checkpoints=[a/best.pt,b/best.pt] max_images=2000",
         "imagegen-bench mode=paper data.root=DIR paper.minutes=30   # softmax, linear, lsh, lsh4; DIR holds MNIST/raw",
         "imagegen-bench mode=paper quick=true threads=1   # the whole pipeline in about two minutes")),
    "plot": Command(
        "imagegen.commands.plot",
        "training curves (bits/dim against steps and minutes) of one or more runs, from their metrics.jsonl, "
        "as one PNG.", (),
        ("imagegen-plot runs=[checkpoints/mnist-linear-small,checkpoints/mnist-softmax-small]",
         "imagegen-plot runs=checkpoints/mnist-linear-small out=curves.png log=true"), uses_device=False),
    "export": Command(
        "imagegen.commands.export",
        "write a static web site that samples a linear checkpoint as an RNN in the browser (serve it with "
        "python -m http.server -d DIR).", (),
        ("imagegen-export checkpoint=checkpoints/mnist-linear-small/best.pt out=site",
         "python -m http.server -d site 8000   # then open http://127.0.0.1:8000/?n=16")),
    "convert": Command(
        "imagegen.commands.convert",
        "write a run's model as OUT.safetensors (weights, no pickle) + OUT.json (config), the form models ship in.",
        (), ("imagegen-convert checkpoint=checkpoints/mnist-linear-cpu_mnist/best.pt out=checkpoints/my-mnist "
             "guidance=2",)),
    "prepare": Command(
        "imagegen.commands.prepare",
        "build or check a dataset's cache (data=folder: convert the folder once), print its counts, size, class "
        "table and skipped files, and draw real images as the model sees them.", ("data",),
        ("imagegen-data prepare data.root=~/pictures data.image_size=32",
         "imagegen-data prepare data.root=~/pictures data.image_size=64 data.channels=1 data.fit=pad",
         "imagegen-data prepare data.root=~/pictures check=true",
         "imagegen-data prepare data=mnist"), uses_device=False, script="imagegen-data prepare"),
    "pack": Command(
        "imagegen.commands.run",
        "pack a run folder into a few size-capped, checksummed files (manifest.json, part-K-of-N.bin) to carry to "
        "another machine, where imagegen-run unpack and imagegen-train resume it (docs/runs.md).", (),
        ("imagegen-run pack run_dir=checkpoints/cifar10-linear-cpu_cifar out=up",
         "imagegen-run pack run_dir=run out=down state=compact max_files=7   # Adam's moments in bfloat16"),
        uses_device=False, script="imagegen-run pack"),
    "unpack": Command(
        "imagegen.commands.run",
        "unpack a pack of imagegen-run pack into a new run folder, every byte checked; imagegen-train with that "
        "run_dir and the run's settings resumes it (docs/runs.md).", (),
        ("imagegen-run unpack pack=up run_dir=checkpoints/moved",
         "imagegen-train run_dir=checkpoints/moved preset=cpu_cifar data=cifar10   # resumes where the pack left off"),
        uses_device=False, script="imagegen-run unpack"),
}


def command_name(config_name):
    return COMMAND_TABLE[config_name].script or f"imagegen-{config_name}"


def check_choices(argv, groups, config_name):
    """Reject an argument holding a control character (an escape code, a newline: no option takes one, and a
    file named with one misleads every listing), unknown config-group choices (model=..., data=..., preset=...),
    and groups this command does not take, before Hydra does."""
    for arg in argv:
        if not arg.isprintable():
            raise UserError(f"the argument {arg} holds a control character, which no option takes; type it "
                            f"without.")
        key, _, value = arg.lstrip("+~").partition("=")
        if key in GROUPS and key not in groups:
            raise UserError(f"{command_name(config_name)} takes no {key}=... (the model and data come from the "
                            f"checkpoint); see {command_name(config_name)} --help for its options.")
        if key == "run_dir" and Path(value).expanduser().is_file():     # Hydra would fail making it its output folder
            raise UserError(f"run_dir {value} is a file, not a folder; choose another run_dir=...")
        if key in groups and value:
            valid = sorted(p.stem for p in (CONF_DIR / key).glob("*.yaml"))
            for choice in value.split(","):                          # a -m sweep: model=linear,softmax
                if choice not in valid:
                    raise UserError(f"unknown {key} {choice!r}; choose one of: {', '.join(valid)}.")


def unreadable(overrides):
    """The first override Hydra's grammar cannot parse on its own, or None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException
    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_overrides([override])
        except OverrideParseException:
            return override
    return None


def compose(config_name, overrides):
    """The config Hydra would build for these overrides, or a UserError saying which one is bad."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else e
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        if (bad := unreadable(overrides)) is not None:
            quoting = any(c in bad for c in "'\" ")
            fix = ("quote a value with spaces as key='a b' (in the shell: \"key='a b'\") and write an apostrophe "
                   "inside it as \\'" if quoting else "write it as key=value, a list as key=[a,b]")
            raise UserError(f"cannot read {bad!r} ({first}): {fix}.") from None
        where = str(e).strip().splitlines()[0]
        where = "" if first in where else where.rstrip(".") + ": "       # Hydra's lexer: the same text twice
        key = getattr(cause, "full_key", None)
        attention = next((a for a, o in config.ATTENTION_OPTIONS.items() if o is getattr(cause, "object_type", None)),
                         None)
        if attention and key and key.startswith("model.attention_options."):   # the options of model='s attention
            option = key.split(".")[2]
            if option not in {f.name for f in fields(config.ATTENTION_OPTIONS[attention])}:
                raise UserError(config.unknown_option(attention, option)) from None
        if "not in" in first and key:
            typed = next((k for k in override_keys(overrides) if k == key or k.startswith(key + ".")), key)
            if typed in ("device", "threads") and not COMMAND_TABLE[config_name].uses_device:
                raise UserError(f"{command_name(config_name)} takes no {typed}=...: it runs no model; "
                                f"drop it.") from None
            raise UserError(f"unknown option {typed!r}{did_you_mean(config_name, typed)}; {command_name(config_name)} "
                            f"--help lists the options.") from None
        if first.startswith("Could not delete from config.") and "' does not exist" in first:   # ~key of no option
            typed = first.split("'")[1]
            raise UserError(f"unknown option {typed!r}{did_you_mean(config_name, typed)}; "
                            f"{command_name(config_name)} --help lists the options.") from None
        if first.startswith("Could not append to config. An item is already at"):      # +key=value of a key there
            typed = first.split("'")[1]
            value = next((a.partition("=")[2] for a in overrides if a.lstrip("+").startswith(typed + "=")), "...")
            raise UserError(f"{typed} is already an option: set it without the + ({typed}={value}).") from None
        raise UserError(f"{where}{first.rstrip('.')}; {command_name(config_name)} --help lists "
                        f"every option and its type.") from None


def expand_home(argv):
    """key=~/DIR and key=~user/DIR with the home folder written out: the shell leaves a ~ after `data.root=`
    as it is (data.root is no variable name), and Hydra's override grammar refuses a value that starts with ~."""
    return [f"{a.partition('=')[0]}={os.path.expanduser(a.partition('=')[2])}"
            if "=" in a and a.partition("=")[2].startswith("~") else a for a in argv]


def override_keys(overrides):
    """The keys of key=value overrides (+key=, ~key= too), as typed."""
    return [a.lstrip("+~").partition("=")[0] for a in overrides if "=" in a]


def did_you_mean(config_name, key):
    """' (did you mean train.max_minutes?)' for the closest option of the command's schema, or ''. key is the
    whole dotted key as typed (trian.max_steps), not just the part Hydra found unknown (trian). A name that is
    an option of a section (imagegen-bench's step_batches: sampling.step_batches; train_batch: train_step.batch)
    gets that section's option, or each section's that has it."""
    import difflib

    options = [k for k, _, _ in config.describe(config.SCHEMAS[config_name])]
    head, dot, rest = key.partition(".")
    within = [o + dot + rest for o in options if o.count(".") == 1 and in_section(head, *o.split("."))]
    close = within or difflib.get_close_matches(key, options, n=1, cutoff=0.75)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def in_section(name, section, option):
    """name is option of section given without it: step_batches for sampling.step_batches, or with the
    section's name (or its start) as a prefix: sampling_precisions, train_batch for train_step.batch."""
    prefix = name[:-len(option)].removesuffix("_") if name.endswith("_" + option) else None
    return name == option or bool(prefix) and section.startswith(prefix)


def help_text(config_name, argv=()):
    """--help: the command, its config groups and every option with its type, default and sentence. The
    defaults shown are those of the config groups chosen in argv (imagegen-train preset=cpu_mnist --help:
    the preset's values), else the command's own."""
    from omegaconf import OmegaConf

    command = COMMAND_TABLE[config_name]
    description, groups, examples = command.description, command.groups, command.examples
    chosen = [a for a in argv if "=" in a and a.partition("=")[0] in groups]
    check_choices(chosen, groups, config_name)
    cfg = OmegaConf.to_container(compose(config_name, chosen), resolve=False)
    lines = [f"{command_name(config_name)}: {description}", "",
             f"usage: {command_name(config_name)} [key=value ...]" + (" [group=choice ...]" if groups else ""), ""]
    if groups:
        lines.append("config groups:")
        for group in groups:
            choices = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
            lines.append(f"  {group}={'|'.join(choices)}")
        lines.append("")
    lines.append("options (key: type = default; meaning):" if not chosen else
                 f"options (key: type = default with {' '.join(chosen)}; meaning):")
    headed, section = config.sections(config.SCHEMAS[config_name]), None
    for key, f in config.options(config.SCHEMAS[config_name]):
        if key.partition(".")[0] != section:
            section = key.partition(".")[0]
            lines += ["", f"{section}.*: {headed[section]}"] if section in headed else []
        value = cfg
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        shown = (f", required (e.g. {key}={f.metadata.get('example', '...')})" if value == "???"   # Hydra's MISSING
                 else f" = {value}")
        lines.append(f"  {key}: {config.type_name(f.type)}{shown}")
        lines.append(f"      {f.metadata.get('help', '')}")
    if "model" in groups:
        lines += [""] + attention_help(cfg["model"])
    if examples:
        lines += ["", "examples:"] + [f"  {e}" for e in examples]
    lines += ["", "Hydra's own flags (--cfg job, -m for sweeps, ...): --hydra-help."]
    return "\n".join(lines)


def attention_help(model):
    """The lines of --help that list each attention's options (config.ATTENTION_OPTIONS), with the model=
    choices that pick it; the defaults shown for the attention of `model` (the composed section) are its
    values there (model=lsh4: n_hashes 4)."""
    from omegaconf import OmegaConf

    picks = {}
    for path in sorted((CONF_DIR / "model").glob("*.yaml")):
        picks.setdefault(OmegaConf.load(path).get("attention"), []).append(path.stem)
    lines = ["attention options (model.attention_options.KEY=VALUE, no +; each attention has its own):"]
    for attention, schema in config.ATTENTION_OPTIONS.items():
        names = picks.get(attention)
        chosen = f"model={'|'.join(names)}" if names else f"model.attention={attention}"
        rows = config.describe(schema, "model.attention_options.")
        lines.append(f"  {attention} ({chosen}){':' if rows else ': no options'}")
        values = (model.get("attention_options") if model.get("attention") == attention else None) or {}
        for f, (key, kind, text) in zip(fields(schema), rows):
            lines.append(f"    {key}: {kind} = {values.get(f.name, f.default)}")
            lines.append(f"        {text}")
    return lines


def early_watch():
    """A torchrun rank watches its launcher from its first lines, before torch is imported (seconds):
    killed then, torchrun would leave it waiting out the rendezvous timeout; already gone: one line."""
    from ..training.signals import watch_launcher
    try:
        watch_launcher()
    except UserError as e:
        sys.exit(f"error: {e}")


def interrupted():
    """Ctrl-C (or a stop the command turned into KeyboardInterrupt): one line, exit status 130."""
    print("interrupted", file=sys.stderr, flush=True)
    sys.exit(130)


def launcher(config_name):
    """The console script's main(): --help printed from the typed configs (hydra and omegaconf, no
    torch: well under a second), anything else handed to the command module's own `main`. Ctrl-C at
    any point, the imports of torch and Hydra included, ends it with one line (`interrupted`)."""
    def main():
        try:
            early_watch()
            if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
                config.register()
                try:
                    print(help_text(config_name, sys.argv[1:]))
                except UserError as e:
                    sys.exit(f"error: {e}")
                return
            import importlib
            importlib.import_module(COMMAND_TABLE[config_name].module).main()
        except KeyboardInterrupt:
            interrupted()
    return main


def hydra_entry(config_name, task):
    """A command module's main() running `task(cfg, device)` under Hydra, cfg the command's schema dataclass
    (config/schema.py, its `device` and `threads` included); overrides are type-checked first and UserErrors
    print as one line.
    A command whose table entry says uses_device=False gets task(cfg, None), and no torch."""
    import hydra
    from omegaconf import OmegaConf

    config.register()
    groups, uses_device = COMMAND_TABLE[config_name].groups, COMMAND_TABLE[config_name].uses_device

    def main():
        early_watch()
        sys.argv[1:] = argv = expand_home(sys.argv[1:])
        try:
            if "--help" in argv or "-h" in argv:
                print(help_text(config_name, argv))
                return
            check_choices(argv, groups, config_name)
            if not any(a.startswith("-") for a in argv):      # sweeps and Hydra flags: Hydra checks them
                compose(config_name, [a for a in argv if not a.startswith("hydra.")])
        except UserError as e:
            sys.exit(f"error: {e}")

        @hydra.main(config_path=str(CONF_DIR), config_name=config_name, version_base="1.3")
        def run(cfg):
            try:
                missing = sorted(k for k in cfg if OmegaConf.is_missing(cfg, k))
                if missing:
                    raise UserError(f"{command_name(config_name)} needs {', '.join(f'{k}=...' for k in missing)}; "
                                    f"see {command_name(config_name)} --help.")
                obj = config.composed(cfg)               # the schema's dataclass, every value typed and resolved
                task(obj, resolve_device(obj.device, obj.threads) if uses_device else None)
            except UserError as e:
                sys.exit(f"error: {e}")
            except KeyboardInterrupt:
                interrupted()
            except OSError as e:             # disk full, read-only folder, ...: what failed, in one line
                where = f" ({printable(e.filename)})" if e.filename else ""
                sys.exit(f"error: {e.strerror or e}{where}; free space or fix the folder's permissions, "
                         f"then run the same command again.")
        run()
    return main


def resolve_device(name="auto", threads=0):
    """The torch device `name` asks for, set up as the Python API sets it up (imagegen.api.use_device: on the
    CPU, malloc set to keep freed memory and torch's thread count fitted to the cores free now (threads=0) or
    set to threads=N, at most the cores)."""
    from ..api import use_device       # torch and the model's code: imported once a command runs, not for --help
    return use_device(name, threads)
