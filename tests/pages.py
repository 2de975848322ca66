"""The exported page's test helpers: a tiny checkpoint, its site, and the page opened and run in Chromium
(tests/conftest.py's browser and serve fixtures)."""
import base64

import numpy as np
import torch

from imagegen.commands.export import export
from imagegen.data.sets import dataset_info
from imagegen.model.transformer import build_model
from imagegen.store import checkpoint


def tiny_checkpoint(path, head="mixture", dataset="mnist", attention="linear", data_root=None, seed=0, num_classes=0,
                    context=()):
    """A checkpoint as imagegen-train writes it, of a tiny model with weights perturbed well away
    from their initialisation (so the distributions are far from uniform); num_classes > 0: class-conditional.
    dataset: a name, or a data section of its own (data=folder at any size); context: model.context."""
    torch.manual_seed(seed)
    options = {"n_buckets": 4, "chunk_size": 4} if attention == "lsh" else {}
    model_cfg = {"attention": attention, "attention_options": options, "n_layers": 2, "d_model": 32, "n_heads": 4,
                 "d_ff": 64, "head": head, "n_mixtures": 5, "dropout": 0.0, "num_classes": num_classes,
                 "context": list(context)}
    data_cfg = dataset if isinstance(dataset, dict) else {
        "name": dataset, "root": str(data_root or path.parent / "no-data"), "download": False, "val_fraction": 0.05,
        "split_seed": 0}
    model = build_model(model_cfg, dataset_info(data_cfg))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    checkpoint.save(path, {"config": {"model": model_cfg, "data": data_cfg, "seed": 0}, "model": model.state_dict()})
    return path


def export_site(ck_path, out, examples=0):
    export({"checkpoint": str(ck_path), "out": str(out), "examples": examples, "data": {"root": None}})
    return out



def open_page(browser, url):
    """A page at url, with its requests and errors recorded; waits until the model is loaded."""
    page = browser.new_page()
    page.requests, page.errors = [], []
    page.on("request", lambda r: page.requests.append(r.url))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.goto(url)
    page.wait_for_function("window.imagegen && ['ready', 'sampling', 'done', 'error'].includes(window.imagegen.status)",
                           timeout=30_000)
    assert page.evaluate("window.imagegen.status") != "error", page.evaluate("window.imagegen.error")
    return page


RUN = """async opts => {
  const r = await window.imagegen.run(opts);
  let params = null;                         // base64 of the float32 bytes: a list of 10^6 numbers is slow to pass
  if (r.params) {
    const b = new Uint8Array(r.params.buffer), parts = [];
    for (let i = 0; i < b.length; i += 0x8000) parts.push(String.fromCharCode.apply(null, b.subarray(i, i + 0x8000)));
    params = btoa(parts.join(""));
  }
  return {bytes: r.bytes, params, msPerStep: r.msPerStep};
}"""


def run_in_page(page, **opts):
    """window.imagegen.run(opts) -> {bytes (list of N lists), params (float32 numpy (N*L*P) or None), msPerStep}."""
    result = page.evaluate(RUN, opts)
    if result["params"] is not None:
        result["params"] = np.frombuffer(base64.b64decode(result["params"]), "<f4")
    return result

