"""One front door (issue 53): the commands that run a model are thin layers over the Python API
(imagegen.api), with its defaults, so the same settings give the same bytes from either: imagegen-sample's
grids and completions are the PNG bytes of load(...).generate / complete + grid, imagegen-eval's bits/dim
is Model.bits_per_dim's, exactly, and imagegen-convert's recorded checks are Model.bits_per_dim's at float32 and
int8 of the model as written."""
import ast
import io
import json
from pathlib import Path

import pytest

import imagegen
from commands import call
from fixtures import mnist_best_pt
from imagegen import api

pytestmark = pytest.mark.usefixtures("one_thread")

PACKAGE = Path(imagegen.__file__).parent
BELOW = ("imagegen.model", "imagegen.ops", "imagegen.sampling")       # what the API stands in front of
THIN = ("sample.py", "evaluate.py", "convert.py")                     # commands that reach nothing below at all
WITHOUT_A_MODEL = {"prepare.py": {"imagegen.sampling.decode.grid"}}    # draws a dataset's images: no Model to ask
TINY = {"attention": "linear", "attention_options": {"impl": "chunked"}, "n_layers": 1, "d_model": 16,
        "n_heads": 2, "d_ff": 32, "head": "categorical", "n_mixtures": 10, "dropout": 0.0, "num_classes": 10}
MODELS = {"linear": TINY, "softmax": {**TINY, "attention": "softmax", "attention_options": {}}}
SCORED = {**MODELS, "lsh": {**TINY, "attention": "lsh", "attention_options": {"n_buckets": 4, "chunk_size": 8}}}


def imports(path):
    """[(module, name)] of every `from X import name` in the file (module-level and inside functions alike),
    X resolved to its absolute dotted name; `import X` gives (X, None)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found += [(module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names]
    return found


def below(module):
    return any(module == b or module.startswith(b + ".") for b in BELOW)


def exposed():
    """The names imagegen.api offers from model/, ops/ and sampling/: those it imports from there (its
    methods wrap them) and its own public names."""
    return {name for module, name in imports(PACKAGE / "api.py") if below(module)} | set(api.__all__)


def test_the_import_parser_resolves_relative_imports():
    assert ("imagegen.api", "load") in imports(PACKAGE / "commands" / "sample.py")
    assert ("imagegen.commands.cli", "hydra_entry") in imports(PACKAGE / "commands" / "sample.py")
    assert {"generate", "grid", "Model"} <= exposed()


@pytest.mark.parametrize("path", sorted((PACKAGE / "commands").glob("*.py")), ids=lambda p: p.name)
def test_no_command_imports_from_below_the_api_what_the_api_offers(path):
    offered = exposed()
    taken = sorted(f"{module}.{name}" for module, name in imports(path) if below(module) and name in offered
                   and f"{module}.{name}" not in WITHOUT_A_MODEL.get(path.name, ()))
    assert not taken, f"{path.name} imports {taken}, which imagegen.api offers; call the API instead"
    if path.name in THIN:
        reached = sorted(f"{module}.{name}" for module, name in imports(path) if below(module))
        assert not reached, f"{path.name} reaches below the API: {reached}"


def png(picture):
    buf = io.BytesIO()
    picture.save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(params=sorted(MODELS))
def best_pt(request, tmp_path, mnist_root):
    return mnist_best_pt(tmp_path, mnist_root, MODELS[request.param])[0]


def test_the_api_samples_with_the_commands_defaults():
    """generate and complete take imagegen-sample's defaults (config.SampleConfig), precision=auto included."""
    import inspect

    from imagegen.config.schema import SampleConfig

    defaults = SampleConfig()
    for method in (api.Model.generate, api.Model.complete):
        params = inspect.signature(method).parameters
        for key in ("precision", "batch_size", "temperature", "seed", "sampler", "guidance"):
            assert params[key].default == getattr(defaults, key), (method.__name__, key)


def test_sample_grid_is_the_apis_generate_and_grid_byte_for_byte(best_pt, tmp_path):
    out = tmp_path / "grid.png"
    proc = call("imagegen-sample", f"checkpoint={best_pt}", f"out={out}", "nrow=2", "seed=3", "device=cpu",
                "threads=1", "progress=false")
    assert proc.returncode == 0, proc.stderr
    model = imagegen.load(best_pt, threads=1, build_kernel=False)
    images = model.generate(labels=[c for c in range(10) for _ in range(2)], seed=3)   # labels=auto: a row per class
    assert out.read_bytes() == png(model.grid(images, nrow=2, row_names=model.class_names))


def test_sample_completions_are_the_apis_complete_and_grid_byte_for_byte(best_pt, tmp_path, mnist_root):
    out = tmp_path / "complete.png"
    proc = call("imagegen-sample", f"checkpoint={best_pt}", "mode=complete", "num_originals=3", "completions=2",
                f"out={out}", "scale=2", "seed=1", "device=cpu", "threads=1", "progress=false",
                f"data.root={mnist_root}")
    assert proc.returncode == 0, proc.stderr
    model = imagegen.load(best_pt, threads=1, build_kernel=False)
    originals, classes = model.load_split("test", n=3, root=str(mnist_root))
    completions = model.complete(originals, n=2, labels=classes, seed=1)
    names = [model.class_names[c] for c in classes]
    assert out.read_bytes() == png(model.grid(completions, scale=2, originals=originals, row_names=names))


@pytest.mark.parametrize("attention", sorted(SCORED))
def test_eval_is_the_apis_bits_per_dim_exactly(attention, tmp_path, mnist_root):
    path = mnist_best_pt(tmp_path, mnist_root, SCORED[attention])[0]
    draws = ["lsh_draws=2", "lsh_seed=5"] if attention == "lsh" else []
    proc = call("imagegen-eval", f"checkpoint={path}", "max_images=6", "batch_size=4", "device=cpu", "threads=1",
                "progress=false", *draws)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(path.with_name("best.test.json").read_text())
    model = imagegen.load(path, threads=1)
    images, labels = model.load_split("test", n=6)
    kwargs = {"lsh_draws": 2, "lsh_seed": 5} if attention == "lsh" else {}
    assert result["bits_per_dim"] == model.bits_per_dim(images, labels, batch_size=4, **kwargs)
    assert result["precision"] == model.scoring_plan().precision == "float32"   # the same default
    if attention == "lsh":       # the draws' seeds were the call's: the model's own is as it was
        assert all(b.attn.eval_seed == 0 for b in model.module.blocks)
        assert result["bits_per_dim"] != model.bits_per_dim(images, labels, batch_size=4)


def test_a_plan_made_first_gives_the_same_bytes_as_the_settings_it_was_made_from():
    model = imagegen.load("mnist-linear", threads=None)
    plan = model.sampling_plan(2, precision="float32", batch_size=2)
    assert (plan.precision, plan.loop, plan.batch, plan.sampler) == ("float32", "recurrent", 2, "step")
    images = model.generate(labels=[1, 2], precision="float32", seed=4)
    assert (images == model.generate(labels=[1, 2], plan=plan, seed=4)).all()


@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_converts_recorded_checks_are_the_apis_bits_per_dim_of_the_written_model(best_pt, precision, tmp_path,
                                                                                  mnist_root):
    """test_check and int8_check hold what the API computes at the same settings for the written model."""
    out = tmp_path / "m"
    proc = call("imagegen-convert", f"checkpoint={best_pt}", f"out={out}", "check_images=5", "batch_size=4",
                f"precision={precision}", "device=cpu", "threads=1", "progress=false", f"data.root={mnist_root}")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.with_suffix(".json").read_text())["record"]
    model = imagegen.load(out.with_suffix(".safetensors"), threads=1)
    images, labels = model.load_split("test", n=5)
    bpd = model.bits_per_dim(images, labels, batch_size=4)
    assert record["test_check"] == {"images": 5, "bits_per_dim": bpd, "labels": True}
    if model.why_not_int8() is not None:
        assert "int8_check" not in record
        return
    plan = model.scoring_plan("int8")
    assert record["int8_check"] == {"images": 5, "float32": bpd, "product": plan.int8_product,
                                    "int8": model.bits_per_dim(images, labels, batch_size=4, precision="int8")}


def test_the_int8_scoring_plan_names_the_product_its_forward_runs(monkeypatch):
    """Plan.int8_product, decided before the run, is the product int8_forward puts on the weights (per row where
    the kernel builds, per call where it does not)."""
    from imagegen.ops import dense
    from imagegen.sampling.decode import int8_forward

    model = imagegen.load("mnist-linear", threads=None)
    if model.why_not_int8() is not None:
        pytest.skip(model.why_not_int8())
    for builds in (True, False):
        monkeypatch.setattr(dense, "takes_kernel", lambda always=False, builds=builds: builds)
        plan = model.scoring_plan("int8")
        with int8_forward(model.module, plan.dtype):
            assert plan.int8_product == dense.int8_product(model.module) == ("per row" if builds else "per call")
    assert model.scoring_plan("float32").int8_product is None
