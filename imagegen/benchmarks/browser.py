"""The exported page's sampler in headless Chromium beside Python's decoding step, in one run
(imagegen-bench mode=browser).

Both time one decoding step (the model step for a batch of images plus their draws); with linear
attention the work per step does not depend on the position, so images/sec = batch / (D * step).
- browser: `window.imagegen.bench(batch, steps)` in the page's Web Worker (float32 typed arrays, one
  thread), with the products and the attention on WebAssembly SIMD (what the page runs) and all in
  JavaScript (what it runs without WebAssembly SIMD), the page exported by
  `imagegen.web.site.write_site` and served from 127.0.0.1; Chromium is Debian's /usr/bin/chromium driven by Playwright;
- Python: `imagegen.benchmarks.sampling.step_latency`, the whole step as one C++ call when the
  fused CPU kernel serves the model (the path `imagegen-sample` takes).
Rounds alternate the two (median over `browser.rounds`), so load from other processes hits both.
"""
import contextlib
import functools
import http.server
import statistics
import tempfile
import threading
from pathlib import Path

import torch

from ..config import BenchConfig, ModelConfig, plain, typed
from ..errors import UserError
from ..web.site import write_site
from ..model.transformer import build_model
from .report import machine, markdown_table
from .sampling import step_latency

CHROMIUM = "/usr/bin/chromium"
SAMPLERS = {"python": "Python ({python_path})", "wasm": "browser (WebAssembly SIMD, Web Worker)",
            "js": "browser (JavaScript only, Web Worker)"}
FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve(folder):
    """A static file server for `folder` on 127.0.0.1 (a free port); yields its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def chromium(profile_dir):
    """A headless Chromium context (fresh profile in profile_dir) driven by Playwright."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise UserError("mode=browser needs playwright (pip install -e .[dev]) and Debian's chromium "
                        "(apt-get install chromium).") from None
    if not Path(CHROMIUM).exists():
        raise UserError(f"mode=browser drives {CHROMIUM}, which is missing; install it with apt-get install chromium.")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(profile_dir), executable_path=CHROMIUM, headless=True,
                                                       args=FLAGS)
        try:
            yield context
        finally:
            context.close()


def run(cfg, model_cfg, info):
    """Random weights of the configured architecture (model_cfg: a ModelConfig, or a dict of one), linear attention;
    cfg: a BenchConfig (or a dict of one). Returns {"rows": [...], ...}."""
    cfg, model_cfg = typed(BenchConfig, cfg), typed(ModelConfig, model_cfg)
    torch.manual_seed(cfg.seed)
    model = build_model({**plain(model_cfg), "attention": "linear", "attention_options": {"impl": "auto"}}, info).eval()
    python_path = "one C++ call" if model.init_state(1, torch.device("cpu")).kernel is not None else "PyTorch per layer"
    batches, steps, D = cfg.browser.batches, cfg.browser.steps, info.length
    times = {(who, b): [] for who in ("python", "wasm", "js") for b in batches}
    with tempfile.TemporaryDirectory() as tmp:
        write_site(model, info.name, Path(tmp) / "site")
        with serve(Path(tmp) / "site") as url, chromium(Path(tmp) / "profile") as browser:
            page = browser.new_page()
            page.goto(url + "?autostart=0")
            page.wait_for_function("window.imagegen && ['ready', 'error'].includes(window.imagegen.status)",
                                   timeout=120_000)
            if page.evaluate("window.imagegen.status") == "error":
                raise UserError(f"the exported page failed to load: {page.evaluate('window.imagegen.error')}")
            for r in range(cfg.browser.rounds):
                for b in batches:
                    times[("python", b)].append(step_latency(model, b, D // 2, reps=steps) * 1e3)
                    for engine in ("wasm", "js"):
                        got = page.evaluate("([n, s, e]) => window.imagegen.bench(n, s, 10, e)", [b, steps, engine])
                        if engine == "wasm" and got["engine"] != "WebAssembly SIMD":
                            raise UserError(f"this Chromium ran the page's arithmetic in {got['engine']}, not "
                                            f"WebAssembly SIMD; use a Chromium with WebAssembly SIMD (version 91 on).")
                        times[(engine, b)].append(got["msPerStep"])
                    print(f"round {r + 1}: batch {b:3d}  python {times[('python', b)][-1]:.3f} ms/step  browser "
                          f"{times[('wasm', b)][-1]:.3f} (WebAssembly), {times[('js', b)][-1]:.3f} (JavaScript) "
                          f"ms/step", flush=True)
    base = statistics.median(times[("python", batches[0])])
    rows = []
    for (who, b), ms in times.items():
        med = statistics.median(ms)
        rows.append({"sampler": SAMPLERS[who].format(python_path=python_path),
                     "batch": b, "ms_per_step": med, "images_per_sec": b / (D * med / 1e3),
                     "vs_python_batch1": med / base, "all_ms": ms})
    rows.sort(key=lambda row: (row["batch"], row["sampler"]))
    for row in rows:                      # images/sec over the same sampler's at the smallest batch
        first = next(r for r in rows if r["sampler"] == row["sampler"])
        row["vs_batch1"] = row["images_per_sec"] / first["images_per_sec"]
    return {"rows": rows, "python_path": python_path, "chromium": browser_version(), "steps": steps}


def browser_version():
    import subprocess
    try:
        return subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        return "unknown"


def report(result, cfg, arch_name, info, model_cfg):
    cols = [("sampler", "sampler", None), ("batch", "batch", None), ("ms_per_step", "ms per step", "{:.3f}"),
            ("images_per_sec", "images/sec", "{:.3g}"), ("vs_batch1", "images/sec over its first batch's", "{:.2f}"),
            ("vs_python_batch1", "x Python's batch-1 step", "{:.2f}")]
    return (f"Decoding-step speed, {arch_name} architecture ({model_cfg.n_layers} layers, d_model "
            f"{model_cfg.d_model}, {model_cfg.n_heads} heads, d_ff {model_cfg.d_ff}, "
            f"{model_cfg.head} head, "
            f"{info.length} sub-pixels), random weights, float32; median of {cfg.browser.rounds} alternating "
            f"rounds "
            f"of {result['steps']} steps.\nMachine: {machine()}; {result['chromium']}.\n\n"
            + markdown_table(result["rows"], cols))
