"""The page's WebAssembly and JavaScript kernels against their references in headless Chromium: the batched
products, the attention's recurrence, phi and GELU, and kernels.wasm against its source (tests/pages.py opens
the page; the browser skips as test_export.py says)."""

import pytest

from imagegen.web.site import WEB_DIR
from pages import export_site, open_page, tiny_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_batched_products_equal_the_reference(browser, serve, tmp_path):
    """sampler.js's products against denseReference (one image, one output at a time): JavaScript's
    dense (2 outputs x 4 images per block, leftovers one by one) and WebAssembly's (panels of 8 outputs
    x 4 images, leftovers one by one), at shapes that leave every kind of remainder, with memory
    growing between calls (weights packed after others were used, scratch for more rows)."""
    ck = tiny_checkpoint(tmp_path / "tiny.pt")
    page = open_page(browser, serve(export_site(ck, tmp_path / "site")) + "?autostart=0")
    assert page.evaluate("window.imagegen.engine") == "WebAssembly SIMD"     # Chromium runs it
    worst = page.evaluate("""async () => {
      const {WasmKernels, dense, denseReference} = await import("./sampler.js");
      const {uniformGenerator} = await import("./draw.js");
      const wasm = WasmKernels.create(new Uint8Array(await (await fetch("kernels.wasm")).arrayBuffer()));
      const rand = uniformGenerator(3), fill = (k) => Float32Array.from({length: k}, () => 2 * rand() - 1);
      const worst = {js: 0, wasm: 0};
      for (const [n, nIn, nOut] of [[1, 7, 5], [3, 16, 9], [4, 33, 8], [5, 64, 3], [16, 32, 96], [18, 5, 1],
                                    [9, 300, 17], [40, 1024, 250]]) {
        const x = fill(n * nIn), W = fill(nIn * nOut), b = fill(nOut), packed = wasm.pack(W, b, nIn, nOut);
        const Wt = new Float32Array(nIn * nOut);          // (O, I), as dense takes it
        for (let i = 0; i < nIn; i++) for (let j = 0; j < nOut; j++) Wt[j * nIn + i] = W[i * nOut + j];
        for (const add of [false, true]) {
          const start = fill(n * nOut), want = start.slice();
          denseReference(x, n, nIn, Wt, b, nOut, want, add);
          const got = {js: start.slice(), wasm: start.slice()};
          dense(x, n, nIn, Wt, b, nOut, got.js, add);
          wasm.dense(x, n, packed, got.wasm, add);
          for (const k of ["js", "wasm"])
            for (let i = 0; i < want.length; i++)
              worst[k] = Math.max(worst[k], Math.abs(got[k][i] - want[i]) / (1 + Math.abs(want[i])));
        }
      }
      return worst;
    }""")
    assert worst["js"] < 1e-6          # both sum in float64 (JavaScript's numbers)
    assert worst["wasm"] < 1e-4        # float32 sums of up to 1,024 terms of size ~1 (1.1e-5 seen)
    assert page.errors == []


@pytest.mark.slow
def test_wasm_attention_equals_the_javascript_recurrence(browser, serve, tmp_path):
    """WasmKernels.attend against Model.attend (the JavaScript recurrence) from the same random state,
    over several positions per image (a prefix's pass) and one (a step): outputs and the state after."""
    ck = tiny_checkpoint(tmp_path / "tiny.pt")
    page = open_page(browser, serve(export_site(ck, tmp_path / "site")) + "?autostart=0")
    worst = page.evaluate("""async () => {
      const {Model, WasmKernels} = await import("./sampler.js");
      const {uniformGenerator} = await import("./draw.js");
      const wasm = WasmKernels.create(new Uint8Array(await (await fetch("kernels.wasm")).arrayBuffer()));
      const rand = uniformGenerator(5);
      const fill = (k, lo = -1) => Float32Array.from({length: k}, () => lo + (1 - lo) * rand());
      let worst = 0;
      const close = (a, b) => {
        for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i] - b[i]) / (1 + Math.abs(b[i])));
      };
      for (const [n, T, H, E] of [[1, 1, 2, 4], [3, 5, 2, 8], [2, 1, 4, 12], [5, 3, 8, 32]]) {
        const D = H * E, qkv = fill(n * T * 3 * D), S0 = fill(n * H * E * E), z0 = fill(n * H * E, 0);
        const js = {n, S: [S0.slice()], z: [z0.slice()], qkv: qkv.slice(), att: new Float32Array(n * T * D)};
        Model.prototype.attend.call({D, H, E}, js, 0, T, 1e-6);
        const S = wasm.alloc(S0.length), z = wasm.alloc(z0.length), att = new Float32Array(n * T * D);
        wasm.view().set(S0, S); wasm.view().set(z0, z);
        wasm.attend(qkv, n, T, S, z, att, H, E, 1e-6);                 // phi applied there
        close(att, js.att);
        close(wasm.view().subarray(S, S + S0.length), js.S[0]);
        close(wasm.view().subarray(z, z + z0.length), js.z[0]);
        wasm.free(S, S0.length); wasm.free(z, z0.length);
      }
      return worst;
    }""")
    assert worst < 1e-5
    assert page.errors == []


@pytest.mark.slow
def test_wasm_phi_and_gelu_equal_javascripts(browser, serve, tmp_path):
    """WebAssembly's phi and GELU (float32, exp by a polynomial) against sampler.js's phi and gelu
    (float64 Math.exp) from -20 to 20 and at the ends of exp's range and beyond; phi on strided rows
    leaves the values between them (v of each qkv row) alone."""
    ck = tiny_checkpoint(tmp_path / "tiny.pt")
    page = open_page(browser, serve(export_site(ck, tmp_path / "site")) + "?autostart=0")
    worst = page.evaluate("""async () => {
      const {WasmKernels, gelu, phi} = await import("./sampler.js");
      const wasm = WasmKernels.create(new Uint8Array(await (await fetch("kernels.wasm")).arrayBuffer()));
      const values = [-1e4, -200, -100, -88, -87.5, -87, -50, -9.5, -1e-8, -0, 0, 1e-8, 3e-39, 100, 1e4];
      for (let i = 0; i <= 4000; i++) values.push(-20 + i / 100);
      while (values.length % 12) values.push(0.25);
      const x = Float32Array.from(values), k = x.length, at = wasm.alloc(k);
      const worst = {phi: 0, gelu: 0, untouched: 0};
      for (const name of ["phi", "gelu"]) {
        wasm.view().set(x, at);
        const want = x.slice();
        if (name === "gelu") {
          wasm.fn.gelu(at * 4, k);
          gelu(want, k);
        } else {                                   // rows of 12: the first 8 mapped, the last 4 kept
          wasm.fn.phi(at * 4, k / 12, 8, 12);
          for (let i = 0; i < k; i++) if (i % 12 < 8) want[i] = phi(x[i]);
        }
        const got = wasm.view().subarray(at, at + k);
        for (let i = 0; i < k; i++) {
          const err = Math.abs(got[i] - want[i]) / (1 + Math.abs(want[i]));
          worst[name] = Math.max(worst[name], Number.isNaN(err) ? Infinity : err);
          if (name === "phi" && i % 12 >= 8 && got[i] !== x[i]) worst.untouched = Infinity;
        }
      }
      return worst;
    }""")
    assert worst["phi"] < 1e-6 and worst["gelu"] < 1e-6, worst        # 3.8e-8 and 9.5e-8 seen
    assert worst["untouched"] == 0
    assert page.errors == []


def test_wasm_is_its_source_assembled():
    """imagegen/web/kernels.wasm is kernels.wat assembled (wasmtime's wat2wasm, in the dev extra)."""
    import wasmtime
    assert wasmtime.wat2wasm((WEB_DIR / "kernels.wat").read_text()) == (WEB_DIR / "kernels.wasm").read_bytes(), (
        "kernels.wasm is stale: assemble kernels.wat again (the command at the top of kernels.wat)")
