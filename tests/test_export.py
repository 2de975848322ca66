"""imagegen-export: the static site, its JavaScript sampler against the Python one in headless
Chromium (Playwright driving Debian's /usr/bin/chromium), and the export's errors.

The browser tests skip only where /usr/bin/chromium (or playwright) is missing and
IMAGEGEN_CI_REQUIRE does not name the browser; CI's does, so there they fail instead."""
import io
import json
from urllib.parse import urlparse

import numpy as np
import pytest
import torch
from PIL import Image

from commands import call, one_line_error
from pages import export_site, open_page, run_in_page, tiny_checkpoint
from imagegen.store import checkpoint
from imagegen.data.sets import dataset_info
from imagegen.errors import UserError
from imagegen.commands.export import export
from imagegen.web.site import safetensors_bytes
from imagegen.model.transformer import START
from imagegen.model.heads import guided_probs
from imagegen.ops.dense import Dense
from imagegen.ops.int8 import quantize_columns
from imagegen.sampling.decode import branches, generate, guided

pytestmark = pytest.mark.usefixtures("one_thread")

MARGIN = 1e-5   # uniforms closer than this (as a share of the total mass) to a CDF edge are moved


def safe_uniforms(model, u, temperature=1.0, prefix=None, labels=None, guidance=1.0):
    """u (N, L) with each draw that falls within MARGIN of an edge of its CDF (float64 model) moved
    to the middle of the most probable value's bin, so that float32 round-off in either sampler
    cannot flip a byte. labels (N,) long or None and guidance as in sampling.generate.
    Returns (uniforms, the bytes they draw from the float64 model, share of draws moved)."""
    model = model.double().eval()
    N, L = u.shape
    u, moved = u.double().clone(), 0
    x = torch.zeros(N, L, dtype=torch.long)
    start = 0 if prefix is None else prefix.shape[1]
    if prefix is not None:
        x[:, :start] = prefix.long()
    guide = guided(model, labels, guidance)
    state = model.init_state(2 * N if guide else N, torch.device("cpu"), torch.float64,
                             labels=None if labels is None else branches(labels, guide))
    token = torch.full((N,), START, dtype=torch.long)
    with torch.inference_mode():
        for t in range(L):
            params, state = model.step(token.repeat(2) if guide else token, state)
            if t >= start:
                p = guided_probs(model.head, params[:N], params[N:] if guide else None, guidance).double()
                if temperature != 1.0:
                    p = torch.softmax(torch.log(p) / temperature, dim=-1)
                cdf = p.cumsum(-1) / p.sum(-1, keepdim=True)
                lower = torch.cat([torch.zeros(N, 1, dtype=cdf.dtype), cdf[:, :-1]], 1)
                b = torch.searchsorted(cdf, u[:, t:t + 1].contiguous()).clamp(max=255)
                near = torch.minimum(u[:, t:t + 1] - lower.gather(1, b), cdf.gather(1, b) - u[:, t:t + 1]) < MARGIN
                best = p.argmax(-1, keepdim=True)
                centre = (lower.gather(1, best) + cdf.gather(1, best)) / 2
                u[:, t:t + 1] = torch.where(near, centre, u[:, t:t + 1])
                moved += int(near.sum())
                x[:, t] = torch.searchsorted(cdf, u[:, t:t + 1].contiguous()).clamp(max=255).squeeze(1)
            token = x[:, t]
    return u, x.to(torch.uint8), moved / (N * (L - start))


# ---------------------------------------------------------------- the browser


# ---------------------------------------------------------------- exactness against Python
@pytest.mark.slow
@pytest.mark.parametrize("head,dataset,temperature", [("mixture", "mnist", 1.0), ("categorical", "cifar10", 0.8)])
def test_browser_sampler_matches_python(browser, serve, tmp_path, head, dataset, temperature):
    ck = tiny_checkpoint(tmp_path / "tiny.pt", head=head, dataset=dataset)
    model = checkpoint.model_from_checkpoint(checkpoint.load(ck)).eval()
    N, L = 2, model.length
    u, py64, moved = safe_uniforms(model, torch.rand(N, L, generator=torch.Generator().manual_seed(1)), temperature)
    assert moved < 0.05                                   # nearly all draws are the random ones
    py32 = generate(model.float(), N, uniforms=u, temperature=temperature, batch_size=N)   # one C++ call per step
    assert torch.equal(py32, py64)

    page = open_page(browser, serve(export_site(ck, tmp_path / "site")) + "?autostart=0")
    result = run_in_page(page, n=N, temperature=temperature, uniforms=u.flatten().tolist(), recordParams=True)
    js = torch.tensor(result["bytes"], dtype=torch.uint8)
    assert torch.equal(js, py32), f"first differing position {(js != py32).nonzero()[:1].tolist()}"
    assert len(set(js.flatten().tolist())) > 10           # not a degenerate image

    with torch.no_grad():
        expected = model.double()(js)                      # (N, L, P): the teacher-forced parameters
    got = torch.from_numpy(result["params"].astype(np.float64)).view(N, L, -1)
    assert (got - expected).abs().max() < 1e-4
    assert expected.abs().max() > 1                        # parameters of a real size, not all ~0
    assert page.errors == []


@pytest.mark.slow
def test_int8_page_matches_python_with_the_dequantized_weights(browser, serve, tmp_path):
    """precision=int8: model.safetensors holds each Dense layer's weight as int8 beside its float32 scales,
    the page reads them as float32 q * scale and draws the bytes of the Python model with those weights."""
    ck = tiny_checkpoint(tmp_path / "tiny.pt", seed=3)
    model = checkpoint.model_from_checkpoint(checkpoint.load(ck)).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, Dense):
                q, s = quantize_columns(m.weight)
                m.weight.copy_(q.float() * s)
    N, L = 2, model.length
    u, py64, moved = safe_uniforms(model, torch.rand(N, L, generator=torch.Generator().manual_seed(5)))
    assert moved < 0.05
    py32 = generate(model.float(), N, uniforms=u, batch_size=N)
    assert torch.equal(py32, py64)

    site = tmp_path / "site"
    export({"checkpoint": str(ck), "out": str(site), "examples": 0, "precision": "int8", "data": {"root": None}})
    blob = (site / "model.safetensors").read_bytes()
    header = json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")])
    assert header["blocks.0.ff.0.weight"]["dtype"] == "I8" and header["blocks.0.ff.0.weight_scale"]["dtype"] == "F32"
    page = open_page(browser, serve(site) + "?autostart=0")
    result = run_in_page(page, n=N, uniforms=u.flatten().tolist(), recordParams=True)
    js = torch.tensor(result["bytes"], dtype=torch.uint8)
    assert torch.equal(js, py32), f"first differing position {(js != py32).nonzero()[:1].tolist()}"
    with torch.no_grad():
        expected = model.double()(js)
    got = torch.from_numpy(result["params"].astype(np.float64)).view(N, L, -1)
    assert (got - expected).abs().max() < 1e-4
    assert page.errors == []


@pytest.mark.slow
def test_page_without_webassembly_draws_the_same_bytes(browser, serve, tmp_path):
    """A site without kernels.wasm (exported before it, or a browser without WebAssembly SIMD) runs the
    products and the attention in JavaScript and draws Python's bytes, as the WebAssembly page does."""
    ck = tiny_checkpoint(tmp_path / "tiny.pt", seed=2)
    model = checkpoint.model_from_checkpoint(checkpoint.load(ck)).eval()
    u, py64, moved = safe_uniforms(model, torch.rand(3, model.length, generator=torch.Generator().manual_seed(4)))
    assert moved < 0.05
    site = export_site(ck, tmp_path / "site")
    (site / "kernels.wasm").unlink()
    page = open_page(browser, serve(site) + "?autostart=0")
    assert page.evaluate("window.imagegen.engine") == "JavaScript"
    js = torch.tensor(run_in_page(page, n=3, uniforms=u.flatten().tolist())["bytes"], dtype=torch.uint8)
    assert torch.equal(js, py64)


@pytest.mark.slow
def test_page_draws_a_64x64_colour_image_as_python_does(browser, serve, tmp_path):
    """12,288 sub-pixels (data=folder data.image_size=64, colour): the page's recurrent sampler
    draws, from the same uniforms, the bytes Python's draws."""
    data = {"name": "folder", "root": str(tmp_path / "no-images"), "image_size": 64, "channels": 3}
    ck = tiny_checkpoint(tmp_path / "tiny64.pt", head="categorical", dataset=data)
    model = checkpoint.model_from_checkpoint(checkpoint.load(ck)).eval()
    assert model.length == 12288
    u, py64, moved = safe_uniforms(model, torch.rand(1, model.length, generator=torch.Generator().manual_seed(2)))
    assert moved < 0.05
    site = export_site(ck, tmp_path / "site")
    assert json.loads((site / "config.json").read_text())["length"] == 12288
    page = open_page(browser, serve(site) + "?autostart=0")
    js = torch.tensor(run_in_page(page, n=1, temperature=1.0, uniforms=u.flatten().tolist())["bytes"],
                      dtype=torch.uint8)
    assert torch.equal(js, py64), f"first differing position {(js != py64).nonzero()[:1].tolist()}"
    assert len(set(js.flatten().tolist())) > 100 and page.errors == []


@pytest.mark.slow
def test_completion_keeps_the_top_half(browser, serve, tmp_path):
    ck = tiny_checkpoint(tmp_path / "tiny.pt", seed=1)
    model = checkpoint.model_from_checkpoint(checkpoint.load(ck)).eval()
    N, L, keep = 3, model.length, model.length // 2
    prefix = torch.randint(0, 256, (N, keep), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    u, py64, _ = safe_uniforms(model, torch.rand(N, L, generator=torch.Generator().manual_seed(3)), prefix=prefix)
    page = open_page(browser, serve(export_site(ck, tmp_path / "site")) + "?autostart=0")
    js = torch.tensor(run_in_page(page, n=N, uniforms=u.flatten().tolist(), prefix=prefix.tolist())["bytes"],
                      dtype=torch.uint8)
    assert torch.equal(js[:, :keep], prefix)
    assert torch.equal(js, py64)
    assert torch.equal(js, generate(model.float(), N, uniforms=u, prefix=prefix, batch_size=N))
    assert page.evaluate("window.imagegen.progress") == [f"row {i} of 14" for i in range(1, 15)]   # sampled rows only


@pytest.mark.slow
@pytest.mark.parametrize("labels,guidance", [(None, 2.5), ([3, 7], 1.0), ([3, 7], 2.5), ([3, -1], 0.5)])
def test_conditional_page_matches_python(browser, serve, tmp_path, labels, guidance):
    """A class-conditional model: labels and classifier-free guidance draw Python's bytes
    (labels=None, the page's "any", is the unconditional branch alone whatever the guidance)."""
    ck = tiny_checkpoint(tmp_path / "tiny.pt", head="categorical", num_classes=10, seed=4)
    model = checkpoint.model_from_checkpoint(checkpoint.load(ck)).eval()
    N, L = 2, model.length
    y = None if labels is None else torch.tensor(labels)
    u, py64, moved = safe_uniforms(model, torch.rand(N, L, generator=torch.Generator().manual_seed(5)), labels=y,
                                   guidance=guidance)
    assert moved < 0.05
    py32 = generate(model.float(), N, uniforms=u, labels=y, guidance=guidance, batch_size=N)
    assert torch.equal(py32, py64)
    if labels is not None:                                 # the labels change the images
        assert not torch.equal(py32, generate(model, N, uniforms=u, batch_size=N))

    page = open_page(browser, serve(export_site(ck, tmp_path / "site")) + "?autostart=0")
    js = run_in_page(page, n=N, uniforms=u.flatten().tolist(), labels=labels, guidance=guidance)["bytes"]
    js = torch.tensor(js, dtype=torch.uint8)
    assert torch.equal(js, py32), f"first differing position {(js != py32).nonzero()[:1].tolist()}"
    assert page.errors == []


@pytest.mark.slow
@pytest.mark.parametrize("context", [(), (2, 28, 29)])
def test_conditional_completion_shares_the_prefix(browser, serve, tmp_path, context):
    """One prefix for every image, two labels and guidance: the prefix is fed once per (label, branch)
    and copied, and the completions equal Python's; with model.context too (the bytes read are fed and
    copied with the state)."""
    ck = tiny_checkpoint(tmp_path / "tiny.pt", head="categorical", num_classes=10, seed=6, context=context)
    model = checkpoint.model_from_checkpoint(checkpoint.load(ck)).eval()
    N, L, keep, G = 3, model.length, 5 * 28, 2.0
    y = torch.tensor([1, 1, 4])
    g = torch.Generator().manual_seed(7)
    prefix = torch.randint(0, 256, (1, keep), dtype=torch.uint8, generator=g).expand(N, -1)
    u, py64, _ = safe_uniforms(model, torch.rand(N, L, generator=torch.Generator().manual_seed(8)), prefix=prefix,
                               labels=y, guidance=G)
    py32 = generate(model.float(), N, uniforms=u, prefix=prefix, labels=y, guidance=G, batch_size=N)
    assert torch.equal(py32, py64)
    page = open_page(browser, serve(export_site(ck, tmp_path / "site")) + "?autostart=0")
    js = run_in_page(page, n=N, uniforms=u.flatten().tolist(), prefix=prefix[0].tolist(), labels=y.tolist(), guidance=G)
    assert torch.equal(torch.tensor(js["bytes"], dtype=torch.uint8), py32)
    assert page.evaluate("window.imagegen.progress") == [f"row {i} of 23" for i in range(1, 24)]


@pytest.mark.slow
def test_page_refuses_bad_labels(browser, serve, tmp_path):
    conditional = tiny_checkpoint(tmp_path / "c.pt", head="categorical", num_classes=10)
    page = open_page(browser, serve(export_site(conditional, tmp_path / "c")) + "?autostart=0")
    with pytest.raises(Exception, match=r"labels must be one class number or 2 of them, each in 0\.\.9"):
        run_in_page(page, n=2, labels=[0, 10])
    plain = tiny_checkpoint(tmp_path / "u.pt", head="categorical")
    page = open_page(browser, serve(export_site(plain, tmp_path / "u")) + "?autostart=0")
    with pytest.raises(Exception, match="this model is unconditional"):
        run_in_page(page, n=2, labels=3)
    assert page.locator("#classView").is_hidden()          # no class picker for an unconditional model



@pytest.mark.slow
def test_page_layout_of_completions_and_mode_switch(browser, serve, tmp_path, mnist_root):
    """16 completions in a 1,100 px window wrap into a grid (the page never scrolls sideways), report
    only the sampled rows, and switching mode takes the grid off the page."""
    ck = tiny_checkpoint(tmp_path / "tiny.pt", data_root=mnist_root)
    site = export_site(ck, tmp_path / "site", examples=2)
    page = browser.new_page()
    page.set_viewport_size({"width": 1100, "height": 900})
    page.goto(serve(site) + "?mode=complete&n=16&seed=2")
    page.wait_for_function("window.imagegen && window.imagegen.status === 'done'", timeout=120_000)
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    assert page.evaluate("document.getElementById('grid').getBoundingClientRect().right") <= 1100
    assert page.evaluate("document.getElementById('grid').width") == 1 + 4 * 29   # 4 tiles per row
    assert page.locator("#given").is_visible()
    assert page.evaluate("window.imagegen.rows") == 14
    assert page.evaluate("window.imagegen.progress")[0] == "row 1 of 14"
    assert "14 rows sampled" in page.inner_text("#stats")

    page.check("input[value=grid]")
    assert page.locator("#grid").is_hidden() and page.locator("#given").is_hidden()
    assert page.evaluate("window.imagegen.bytes") is None
    page.click("#go")
    page.wait_for_function("window.imagegen.status === 'done'", timeout=120_000)
    assert page.locator("#grid").is_visible() and page.locator("#given").is_hidden()
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")


def test_config_json_counts_the_model_and_names_the_classes(tmp_path):
    import json
    for classes in (0, 10):
        ck = tiny_checkpoint(tmp_path / f"ck{classes}.pt", num_classes=classes)
        model = checkpoint.model_from_checkpoint(checkpoint.load(ck))
        export({"checkpoint": str(ck), "out": str(tmp_path / f"site{classes}"), "examples": 0, "data": {"root": None},
                "guidance": 3.0})
        config = json.loads((tmp_path / f"site{classes}" / "config.json").read_text())
        assert config["n_params"] == sum(p.numel() for p in model.parameters()) > 10_000
        assert config["head_params"] == model.head.n_params == 15
        assert config["num_classes"] == classes and config["guidance"] == 3.0
        assert config["class_names"] == (list(dataset_info("mnist").class_names) if classes else [])


# ---------------------------------------------------------------- the page as a visitor sees it
@pytest.mark.slow
def test_page_samples_a_grid_from_the_local_server_only(browser, serve, tmp_path, mnist_root):
    ck = tiny_checkpoint(tmp_path / "tiny.pt", data_root=mnist_root)
    site = export_site(ck, tmp_path / "site", examples=4)
    assert sorted(p.name for p in site.iterdir() if p.name != ".imagegen-files.json") == [
        "config.json", "draw.js", "examples.bin", "index.html", "kernels.wasm", "model.safetensors", "page.js",
        "sampler.js", "worker.js"]
    url = serve(site)
    page = open_page(browser, url + "?n=4&seed=5")
    page.wait_for_function("window.imagegen.status === 'done'", timeout=30_000)
    bytes_ = np.array(page.evaluate("window.imagegen.bytes"), np.uint8)
    assert bytes_.shape == (4, 784) and page.evaluate("window.imagegen.msPerStep") > 0
    assert "images/sec" in page.inner_text("#stats")
    shot = np.asarray(Image.open(io.BytesIO(page.locator("#grid").screenshot())).convert("L"), np.float64)
    assert shot.std() > 20 and len(np.unique(shot)) > 20  # a grid of sampled pixels, not a blank canvas

    # completion mode from the query string: the first test image's top half is kept in every completion
    page.goto(url + "?mode=complete&n=3&seed=1")
    page.wait_for_function("window.imagegen.status === 'done'", timeout=30_000)
    example = np.frombuffer((site / "examples.bin").read_bytes(), np.uint8)[:784]
    completed = np.array(page.evaluate("window.imagegen.bytes"), np.uint8)
    assert completed.shape == (3, 784) and (completed[:, :392] == example[:392]).all()

    host = urlparse(url).netloc
    assert [r for r in page.requests if urlparse(r).netloc != host] == []
    assert page.errors == []


# ---------------------------------------------------------------- the files and the errors (no browser)
def test_weights_file_is_standard_safetensors(tmp_path):
    from safetensors.numpy import load_file
    tensors = {"a": torch.randn(3, 5), "b.c": torch.arange(7.0)}
    (tmp_path / "w.safetensors").write_bytes(safetensors_bytes(tensors))
    loaded = load_file(tmp_path / "w.safetensors")
    assert sorted(loaded) == ["a", "b.c"] and all(np.array_equal(loaded[k], v.numpy()) for k, v in tensors.items())
    assert int.from_bytes(safetensors_bytes(tensors)[:8], "little") % 8 == 0   # data 8-byte aligned


@pytest.mark.parametrize("attention", ["softmax", "lsh"])
def test_export_refuses_attention_the_page_cannot_run(tmp_path, attention):
    ck = tiny_checkpoint(tmp_path / "ck.pt", attention=attention)
    with pytest.raises(UserError, match=f"uses {attention} attention.*linear attention only"):
        export_site(ck, tmp_path / "site")
    assert not (tmp_path / "site").exists()


def test_export_errors_are_one_sentence(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="not a readable checkpoint"):
        export_site(bad, tmp_path / "site")
    ck = tiny_checkpoint(tmp_path / "ck.pt")
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="could not write site .*pass out=DIR"):
        export_site(ck, tmp_path / "file" / "site")
    # through the console script: one line on stderr, no traceback
    proc = call("imagegen-export", f"checkpoint={bad}", f"out={tmp_path / 'site'}")
    one_line_error(proc, "not a readable checkpoint")
