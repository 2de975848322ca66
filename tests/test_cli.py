"""End-to-end through the console scripts (subprocesses with Hydra overrides)."""
import gzip
import json
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image

from commands import TINY, call, one_line_error, run


@pytest.mark.slow
def test_train_resume_eval_mnist(mnist_root, tmp_path):
    run_dir = tmp_path / "run"
    run("imagegen-train", "model=linear", f"data.root={mnist_root}", f"run_dir={run_dir}", "train.max_steps=4", *TINY)
    assert (run_dir / "last.pt").exists() and (run_dir / "best.pt").exists()
    assert torch.load(run_dir / "last.pt", weights_only=True)["state"]["step"] == 4

    proc = run("imagegen-train", "model=linear", f"data.root={mnist_root}", f"run_dir={run_dir}",
               "train.max_steps=6", *TINY)
    assert "resuming" in proc.stdout and "at step 4" in proc.stdout
    assert torch.load(run_dir / "last.pt", weights_only=True)["state"]["step"] == 6
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert list(run_dir.glob("events.out.tfevents.*"))       # TensorBoard (installed by the dev extra)

    proc = run("imagegen-eval", f"checkpoint={run_dir / 'last.pt'}", "batch_size=8", "progress=false")
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("bits/dim: ") and 0 < float(last.split()[1]) < 9
    result = json.loads((run_dir / "last.test.json").read_text())
    assert result["images"] == 16 and result["checkpoint_step"] == 6

    # resuming with a different architecture is refused in one sentence
    one_line_error(run("imagegen-train", "model=softmax", f"data.root={mnist_root}", f"run_dir={run_dir}",
                       "train.max_steps=8", *TINY, check=False), "different architecture")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["softmax", "lsh"])
def test_train_and_eval_cifar(model, cifar_root, tmp_path):
    run("imagegen-train", f"model={model}", "data=cifar10", f"data.root={cifar_root}", f"run_dir={tmp_path}",
        "train.max_steps=2", *TINY[:-4], "train.val_images=2", "train.progress=false", "threads=1")
    proc = run("imagegen-eval", f"checkpoint={tmp_path / 'best.pt'}", "max_images=2", "lsh_draws=2", "progress=false")
    assert proc.stdout.strip().splitlines()[-1].startswith("bits/dim: ")


@pytest.mark.parametrize("args,pattern", [
    (["model=foo"], "unknown model 'foo'; choose one of: linear, lsh, lsh4, softmax."),
    (["data=svhn"], "unknown data 'svhn'; choose one of: cifar10, cifar100, fashion_mnist, folder, imagenet32, "
                     "imagenet64, mnist."),
    (["preset=huge"], "unknown preset 'huge'; choose one of: cpu_64, cpu_cifar, cpu_mnist, paper_cifar, "
                      "paper_mnist, small."),
    (["data.root=/nonexistent", "run_dir=/tmp/imagegen-never"], "MNIST not found"),
    (["train.bf16=maybe", "run_dir=/tmp/imagegen-never"], "train.bf16 must be auto, true or false, not 'maybe'."),
    # an option the attention does not have: it, the attention and the attention's options, in one sentence
    (["model.attention_options.bogus=1"], "the linear attention has no option 'bogus' (model.attention_options.bogus); "
                                          "its options are impl, feature_map, n_features, redraw_every, gate"),
    (["model.attention_options.feture_map=favor"], "(model.attention_options.feture_map; did you mean feature_map?)"),
    (["model=lsh4", "model.attention_options.gate=head"], "the lsh attention has no option 'gate' "
                                                          "(model.attention_options.gate); its options are n_hashes, "
                                                          "n_buckets, chunk_size, eval_seed"),
    (["model=softmax", "model.attention_options.impl=auto"], "the softmax attention has no option 'impl' "
                                                             "(model.attention_options.impl); it takes none"),
    (["+model.attention_options.bogus=1", "run_dir=/tmp/imagegen-never"], "the linear attention has no option 'bogus'"),
    (["+model.attention_options.feature_map=favor"], "model.attention_options.feature_map is already an option: set "
                                                     "it without the + (model.attention_options.feature_map=favor)."),
    (["model.attention_options.n_features=many"], "model.attention_options.n_features=many"),
    (["+train.bogus=1", "run_dir=/tmp/imagegen-never"], "train.bogus is no option of this command; drop it"),
])
def test_train_errors_are_one_sentence(args, pattern, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_error(call("imagegen-train", *args), pattern)


@pytest.mark.slow
def test_attention_options_without_plus(mnist_root, tmp_path):
    """model.attention_options.KEY=VALUE of the attention model= picks, with no +, trains; the checkpoint
    keeps a plain dict of all the attention's options."""
    run("imagegen-train", "model=linear", "model.attention_options.feature_map=favor",
        "model.attention_options.n_features=8", f"data.root={mnist_root}", f"run_dir={tmp_path}",
        "train.max_steps=2", *TINY)
    options = torch.load(tmp_path / "last.pt", weights_only=True)["config"]["model"]["attention_options"]
    assert type(options) is dict and options == {"impl": "auto", "feature_map": "favor", "n_features": 8,
                                                  "redraw_every": 0, "gate": "none"}


def test_an_override_the_grammar_cannot_read_is_named_with_its_fix():
    """An apostrophe inside a quoted value (Hydra's grammar ends the quote there) or a broken list: one sentence
    naming the override and how to write it, not the parser's bare message."""
    from imagegen import config
    from imagegen.commands.cli import compose
    from imagegen.errors import UserError
    config.register()
    apostrophe = r"""cannot read "speedrun.load='the helpers' tests'" .*apostrophe inside it as \\'"""
    with pytest.raises(UserError, match=apostrophe):
        compose("bench", ["mode=speedrun", "speedrun.load='the helpers' tests'"])
    with pytest.raises(UserError, match=r"cannot read 'speedrun.budgets=\[1,' .*a list as key=\[a,b\]\.$"):
        compose("bench", ["mode=speedrun", "speedrun.budgets=[1,"])
    assert compose("bench", ["mode=speedrun", r"speedrun.load='the helpers\' tests'"]).speedrun.load == \
        "the helpers' tests"


def test_attention_options_compose_typed():
    from imagegen import config
    from imagegen.commands.cli import compose
    config.register()
    cfg = compose("train", ["model.attention_options.feature_map=favor", "model.attention_options.n_features=8"])
    assert dict(cfg.model.attention_options) == {"impl": "auto", "feature_map": "favor", "n_features": 8,
                                                 "redraw_every": 0, "gate": "none"}
    assert dict(compose("train", ["model=lsh4"]).model.attention_options) == {
        "n_hashes": 4, "n_buckets": 64, "chunk_size": 32, "eval_seed": 0}
    assert dict(compose("bench", ["model=softmax"]).model.attention_options) == {}


def test_help_lists_each_attentions_options():
    from dataclasses import fields
    from imagegen.config import ATTENTION_OPTIONS
    out = call("imagegen-train", "--help").stdout
    assert "  linear (model=linear):" in out and "  lsh (model=lsh|lsh4):" in out
    assert "  softmax (model=softmax): no options" in out
    for schema in ATTENTION_OPTIONS.values():
        for f in fields(schema):
            kind = f.type.__name__ if isinstance(f.type, type) else str(f.type).replace("typing.", "")
            assert f"    model.attention_options.{f.name}: {kind} = {f.default}\n        {f.metadata['help']}\n" in out
    assert "model.attention_options.n_hashes: int = 4" in call("imagegen-train", "model=lsh4", "--help").stdout
    assert "  lsh (model=lsh|lsh4):" in call("imagegen-bench", "--help").stdout


def test_eval_errors_are_one_sentence(tmp_path):
    junk = tmp_path / "model.pt"
    junk.write_bytes(b"\x00" * 100)
    one_line_error(call("imagegen-eval", f"checkpoint={junk}"), "not a readable checkpoint")
    one_line_error(call("imagegen-eval", f"checkpoint={tmp_path / 'nope.pt'}"), "does not exist")


@pytest.mark.slow
def test_sample_grid_and_completion(mnist_root, tmp_path):
    run("imagegen-train", f"data.root={mnist_root}", f"run_dir={tmp_path}", "train.max_steps=1", *TINY)
    out = tmp_path / "grid.png"
    proc = run("imagegen-sample", f"checkpoint={tmp_path / 'last.pt'}", "num_images=6", "nrow=3", "scale=2",
               f"out={out}", "batch_size=3", "progress=false", "save_each=true")
    assert "images/sec" in proc.stdout
    # 3 x 2 tiles of 28 px with 2 px padding, upscaled 2x
    assert Image.open(out).size == ((3 * 30 + 2) * 2, (2 * 30 + 2) * 2)
    assert len(list((tmp_path / "grid").glob("*.png"))) == 6
    out = tmp_path / "complete.png"
    run("imagegen-sample", f"checkpoint={tmp_path / 'last.pt'}", "mode=complete", "num_originals=2", "completions=3",
        f"out={out}", "scale=1", "progress=false")
    assert Image.open(out).size == (5 * 30 + 2, 2 * 30 + 2)
    run("imagegen-sample", f"checkpoint={tmp_path / 'last.pt'}", "mode=complete", "originals=per_class",
        "completions=1", f"out={out}", "scale=1", "progress=false")       # a row for each class in the test files
    classes = len(set(gzip.decompress((mnist_root / "MNIST/raw/t10k-labels-idx1-ubyte.gz").read_bytes())[8:]))
    assert Image.open(out).size == (3 * 30 + 2, classes * 30 + 2)


def test_first_of_each_class():
    from imagegen.commands.sample import first_of_each_class
    assert first_of_each_class(torch.tensor([3, 1, 3, 0, 1])).tolist() == [3, 1, 0]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the setting is glibc's")
@pytest.mark.parametrize("kept", [True, False])
def test_keep_freed_memory(kept):
    """keep_freed_memory (imagegen-train on the CPU) makes malloc reuse large freed blocks: a 128 MB
    tensor made after a 256 MB one was freed then faults in no new pages, where by default it
    faults in all 32,768."""
    code = ("import resource, torch\n"
            "from imagegen.tuning.allocator import keep_freed_memory\n"
            f"{'keep_freed_memory()' if kept else 'pass'}\n"
            "torch.ones(64 << 20)\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "torch.ones(32 << 20)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n")
    faults = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert faults < 1000 if kept else faults > 30000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the setting is glibc's")
@pytest.mark.parametrize("entry", ["command", "load"])
def test_every_entry_keeps_freed_memory(tmp_path, entry):
    """Every command (through cli.resolve_device) and imagegen.load set memory up once: after either,
    tensors of 32 and 64 MB made in turn, as the numerator's outputs at 8,192 and 16,384 positions,
    fault in no new pages after the first of each, where by default each one maps its pages afresh,
    and with malloc's setting alone torch's posix_memalign blocks were not reused at most calls."""
    from fixtures import skip_without_cpu_kernel, tiny_checkpoint
    from imagegen.ops import kernel_error
    if kernel_error("cpu") is not None:
        skip_without_cpu_kernel("torch allocates through the kernel's allocator")
    path = tiny_checkpoint(tmp_path / "tiny.pt")
    setup = {"command": "from imagegen.commands.cli import resolve_device; resolve_device('cpu', 1)",
             "load": f"import imagegen; imagegen.load({str(path)!r}, threads=1)"}[entry]
    code = (f"import resource, torch\n{setup}\n"
            "torch.ones(8 << 20); torch.ones(16 << 20)\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "for _ in range(4):\n"
            "    torch.ones(8 << 20); torch.ones(16 << 20)\n"
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 8)\n")
    env = {**os.environ, "IMAGEGEN_PROBE": "0"}
    faults = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                check=True).stdout.split()[-1])
    assert faults < 100


@pytest.mark.slow
def test_bench_attention_and_train_step_tables(tmp_path):
    """The kernels benchmarks run end to end on tiny shapes: one row per dtype and impl (precision
    and attention), each with a time and a ratio to softmax, in the JSON and the Markdown table."""
    run("imagegen-bench", "mode=attention", "attention.lengths=[33]", "attention.batch=1", "attention.heads=2",
        "attention.head_dim=4", "attention.repeat=1", "attention.impls=[softmax,kernel]",
        "attention.dtypes=[float32,bfloat16]", "threads=1", f"out_dir={tmp_path}")
    rows = json.loads((tmp_path / "attention.json").read_text())["rows"]
    assert [(r["dtype"], r["impl"]) for r in rows] == [("float32", "softmax"), ("float32", "kernel"),
                                                       ("bfloat16", "softmax"), ("bfloat16", "kernel")]
    assert all(r["fwd_bwd_ms"] > 0 and r["speedup_fwd_bwd"] > 0 and r["peak_mib"] > 0 for r in rows)
    run("imagegen-bench", "mode=train_step", "train_step.lengths.mnist=20", "~train_step.lengths.cifar10",
        "train_step.batch=2", "train_step.repeat=1", "train_step.precisions=[float32,bfloat16]", *TINY[:5],
        "threads=1", f"out_dir={tmp_path}")
    rows = json.loads((tmp_path / "train_step.json").read_text())["rows"]
    assert [(r["precision"], r["attention"]) for r in rows] == [("float32", "softmax"), ("float32", "linear"),
                                                                ("bfloat16", "softmax"), ("bfloat16", "linear")]
    assert all(r["step_ms"] > 0 and r["speedup"] > 0 and r["peak_mib"] > 0 for r in rows)
    assert "| mnist | 20 | bfloat16 | linear |" in (tmp_path / "train_step.md").read_text()
    bad = run("imagegen-bench", "mode=attention", "attention.dtypes=[float16]", f"out_dir={tmp_path}", check=False)
    one_line_error(bad, "unknown dtype 'float16' in attention.dtypes")


def test_train_init_starts_from_given_weights(mnist_root, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    base = ["model=linear", f"data.root={mnist_root}", *TINY, "train.val_every=100"]
    assert call("imagegen-train", *base, f"run_dir={first}", "train.max_steps=2").returncode == 0
    proc = call("imagegen-train", *base, f"run_dir={second}", "train.max_steps=1", "train.lr=1e-30",
                f"train.init={first / 'last.pt'}", "model.dropout=0.1")     # dropout is not architecture
    assert proc.returncode == 0 and "starting from the weights of" in proc.stdout, proc.stderr
    old, new = (torch.load(d / "last.pt", weights_only=True)["model"] for d in (first, second))
    assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old)   # a step of 1e-30 rounds away
    assert call("imagegen-train", *base, f"run_dir={tmp_path / 'c'}", "train.max_steps=1",
                "train.lr=1e-30").returncode == 0     # without train.init the same command starts elsewhere
    other = torch.load(tmp_path / "c" / "last.pt", weights_only=True)["model"]
    assert not all(torch.equal(old[k], other[k]) for k in other)

    one_line_error(call("imagegen-train", *base, f"run_dir={tmp_path / 'd'}", "train.max_steps=1",
                        f"train.init={first / 'last.pt'}", "model.d_model=32"),
                   "has another architecture than this run (model.d_model: 16 in checkpoint vs 32 now)")
    one_line_error(call("imagegen-train", *base, f"run_dir={tmp_path / 'e'}", "train.max_steps=1",
                        f"train.init={tmp_path / 'nope.pt'}"), "does not exist")


def test_train_init_of_a_model_of_other_images_names_both_sets(mnist_root, cifar_root, tmp_path):
    """An MNIST model as train.init of a CIFAR-10 run was called "damaged or was edited"; the file is intact."""
    from fixtures import tiny_checkpoint
    mnist = tiny_checkpoint(tmp_path / "mnist.pt")
    proc = call("imagegen-train", "model=linear", *TINY, "data=cifar10", f"data.root={cifar_root}",
                f"run_dir={tmp_path / 'run'}", f"train.init={mnist}")
    one_line_error(proc, f"train.init={mnist} is a model of mnist images (28x28, 1 channel) and this run trains on "
                         f"cifar10 (32x32, 3 channels); pass train.init a model of 32x32, 3 channels images")
    assert "damaged" not in proc.stderr and not (tmp_path / "run" / "last.pt").exists()


def test_a_home_folder_in_a_value_is_written_out(tmp_path, monkeypatch):
    """data.root=~/pictures (the README's, docs/data.md's): no shell expands a ~ after `data.root=`, and
    Hydra's grammar refused it ("LexerNoViableAltException: data.root=~/pictures")."""
    monkeypatch.setenv("HOME", str(tmp_path))
    proc = call("imagegen-data", "prepare", "data=folder", "data.root=~/pictures", "data.image_size=8")
    one_line_error(proc, f"data.root {tmp_path / 'pictures'} does not exist")
