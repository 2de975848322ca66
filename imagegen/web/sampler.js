// The linear transformer as an RNN in float32 typed arrays: the arithmetic of
// imagegen.model.PixelTransformer.step (embeddings, pre-LN blocks, linear attention with
// phi = elu + 1 and per-head state S (E x E) and z (E), exact-GELU feed-forward, ln_f, proj)
// (the heads' probabilities and the draw: draw.js). N images step together: the products run weights outer, batch inner,
// four images per weight load, so a batch shares each weight read. The products and the attention's
// recurrence run on WebAssembly SIMD (kernels.wat, `WasmKernels`) where the browser has it, else in
// JavaScript (`dense` and the loop in `Model.layers`, also the reference the tests compare with).
// Shape letters: N images (rows), D model dim, H heads, E head dim, F feed-forward dim, P head params,
// C classes, T positions.
// No DOM, no network: the worker (worker.js) and tests import it.

/** Parse a safetensors file (8-byte LE header length, JSON header, raw LE tensors): {name: {shape, data}},
 * data a Float32Array. An int8 weight X.weight (I8, (in, out)) beside its scales X.weight_scale (F32, (out,))
 * (imagegen-export precision=int8) is read as float32 q * scale, as imagegen.store.shipped.dequantized does. */
export function parseSafetensors(buffer) {
  const view = new DataView(buffer);
  const headerLength = Number(view.getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 8, headerLength)));
  const start = 8 + headerLength, tensors = {}, int8 = [];
  for (const [name, info] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    const [a, b] = info.data_offsets, bytes = buffer.slice(start + a, start + b);
    if (info.dtype === "I8") int8.push(name);
    else if (info.dtype !== "F32") throw new Error(`tensor ${name} is ${info.dtype}; the page reads F32 and I8 only`);
    tensors[name] = {shape: info.shape, data: info.dtype === "I8" ? new Int8Array(bytes) : new Float32Array(bytes)};
  }
  for (const name of int8) {
    const q = tensors[name], s = tensors[name + "_scale"], [nIn, nOut] = q.shape;
    if (q.shape.length !== 2 || !s || s.data instanceof Int8Array || s.data.length !== nOut) {
      throw new Error(`int8 tensor ${name} has no float32 scales ${name}_scale of one per output column`);
    }
    const w = new Float32Array(nIn * nOut);
    for (let i = 0; i < nIn; i++) for (let j = 0; j < nOut; j++) w[i * nOut + j] = q.data[i * nOut + j] * s.data[j];
    tensors[name] = {shape: q.shape, data: w};
    delete tensors[name + "_scale"];
  }
  return tensors;
}

/** W (in, out) as stored by imagegen.layers.Dense -> (out, in), so each output is a dot product
 * over one contiguous row (an accumulator in a register instead of a store per multiply-add). */
function transposed(t) {
  const [nIn, nOut] = t.shape, w = new Float32Array(nIn * nOut);
  for (let i = 0; i < nIn; i++) for (let j = 0; j < nOut; j++) w[j * nIn + i] = t.data[i * nOut + j];
  return w;
}

/** Reference product, one image at a time: out (N, nOut) = x (N, nIn) @ W + b with Wt (nOut, nIn);
 * add=true adds to out instead. `dense` computes the same; tests compare the two. */
export function denseReference(x, n, nIn, Wt, b, nOut, out, add) {
  for (let r = 0; r < n; r++) {
    for (let j = 0; j < nOut; j++) {
      let s = 0;
      for (let i = 0; i < nIn; i++) s += x[r * nIn + i] * Wt[j * nIn + i];
      out[r * nOut + j] = (add ? out[r * nOut + j] : 0) + b[j] + s;
    }
  }
}

/** out (N, nOut) = x (N, nIn) @ W + b, with Wt (nOut, nIn); add=true adds to out instead.
 * Weights outer, batch inner, in blocks of 2 outputs x 4 images: each weight loaded is used for
 * four images and each input for two outputs (8 accumulators), so a batch reads the weights once
 * per four images instead of once per image. Odd outputs and the N mod 4 images left over take
 * `dot` (one output of one image). */
export function dense(x, n, nIn, Wt, b, nOut, out, add) {
  const n4 = n - (n % 4), j2 = nOut - (nOut % 2);
  for (let j = 0; j < j2; j += 2) {
    const wa = j * nIn, wb = wa + nIn;
    for (let r = 0; r < n4; r += 4) {
      const x0 = r * nIn, x1 = x0 + nIn, x2 = x1 + nIn, x3 = x2 + nIn;
      let a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
      for (let i = 0; i < nIn; i++) {
        const u = Wt[wa + i], v = Wt[wb + i], y0 = x[x0 + i], y1 = x[x1 + i], y2 = x[x2 + i], y3 = x[x3 + i];
        a0 += y0 * u; a1 += y1 * u; a2 += y2 * u; a3 += y3 * u;
        b0 += y0 * v; b1 += y1 * v; b2 += y2 * v; b3 += y3 * v;
      }
      const o = r * nOut + j, ba = b[j], bb = b[j + 1];
      put(out, o, ba + a0, add); put(out, o + nOut, ba + a1, add);
      put(out, o + 2 * nOut, ba + a2, add); put(out, o + 3 * nOut, ba + a3, add);
      put(out, o + 1, bb + b0, add); put(out, o + 1 + nOut, bb + b1, add);
      put(out, o + 1 + 2 * nOut, bb + b2, add); put(out, o + 1 + 3 * nOut, bb + b3, add);
    }
    for (let r = n4; r < n; r++) {
      put(out, r * nOut + j, b[j] + dot(x, r * nIn, Wt, wa, nIn), add);
      put(out, r * nOut + j + 1, b[j + 1] + dot(x, r * nIn, Wt, wb, nIn), add);
    }
  }
  for (let j = j2; j < nOut; j++) for (let r = 0; r < n; r++) put(out, r * nOut + j, b[j] + dot(x, r * nIn, Wt, j * nIn, nIn), add);
}

const put = (out, o, v, add) => { out[o] = add ? out[o] + v : v; };

/** The page's arithmetic on WebAssembly 128-bit SIMD (kernels.wasm, assembled from kernels.wat):
 * the products (`dense`, 6-8x JavaScript's) and the attention's recurrence (`attend`), in the
 * module's memory. Each weight matrix is packed there once, in panels of 8 outputs (I x 8 floats
 * each, outputs padded to a multiple of 8); the decoding states' S and z live there too (`Model.init`);
 * per call the inputs are copied in and the outputs back, a few rows against the work on them.
 * Memory: a bump allocator whose freed blocks are reused by later requests of the same size. */
export class WasmKernels {
  /** bytes: kernels.wasm; null where this browser runs no WebAssembly SIMD (the caller uses JavaScript). */
  static create(bytes) {
    if (!bytes || typeof WebAssembly === "undefined" || !WebAssembly.validate(bytes)) return null;
    return new WasmKernels(bytes);
  }

  constructor(bytes) {
    this.memory = new WebAssembly.Memory({initial: 1});
    this.fn = new WebAssembly.Instance(new WebAssembly.Module(bytes), {env: {memory: this.memory}}).exports;
    this.top = 0;                  // floats allocated so far
    this.freed = new Map();        // size in floats -> offsets of freed blocks of that size
    this.scratches = {};           // name -> {at, size}: the copy-in / copy-out buffers
  }

  /** The offset (in floats, 16-byte aligned) of k floats, zeroed; the memory grows as needed. */
  alloc(k) {
    const size = Math.ceil(k / 4) * 4, reuse = this.freed.get(size);
    if (reuse && reuse.length) {
      const at = reuse.pop();
      this.view().fill(0, at, at + size);
      return at;
    }
    const at = this.top;
    this.top += size;
    const short = this.top * 4 - this.memory.buffer.byteLength;
    if (short > 0) this.memory.grow(Math.ceil(short / 65536));
    return at;
  }

  /** Give back the block of k floats at offset `at` (from alloc). */
  free(at, k) {
    const size = Math.ceil(k / 4) * 4;
    if (!this.freed.has(size)) this.freed.set(size, []);
    this.freed.get(size).push(at);
  }

  /** The offset of the scratch buffer `name`, of at least k floats (a larger one replaces it). */
  scratch(name, k) {
    const s = this.scratches[name];
    if (s && s.size >= k) return s.at;
    if (s) this.free(s.at, s.size);
    this.scratches[name] = {at: this.alloc(k), size: k};
    return this.scratches[name].at;
  }

  /** A float view of the memory (a new one after the memory grew: growing detaches the old). */
  view() {
    if (!this.f32 || this.f32.buffer !== this.memory.buffer) this.f32 = new Float32Array(this.memory.buffer);
    return this.f32;
  }

  /** W (I, O) as stored by imagegen.layers.Dense and b (O) -> the packed layer for `dense`. */
  pack(W, b, nIn, nOut) {
    const nOutP = Math.ceil(nOut / 8) * 8, w = this.alloc(nIn * nOutP), bias = this.alloc(nOutP), m = this.view();
    for (let i = 0; i < nIn; i++)
      for (let j = 0; j < nOut; j++) m[w + (j >> 3) * nIn * 8 + i * 8 + (j & 7)] = W[i * nOut + j];
    m.set(b, bias);
    return {nIn, nOut, nOutP, w, b: bias};
  }

  /** out (N, O) = x (N, I) @ W + b for a packed layer p; add=true adds to out instead (as `dense`);
   * withGelu=true: GELU(x @ W + b). */
  dense(x, n, p, out, add, withGelu = false) {
    const xs = this.scratch("x", n * p.nIn), os = this.scratch("out", n * p.nOutP);
    this.view().set(x.subarray(0, n * p.nIn), xs);
    this.fn.dense(xs * 4, n, p.nIn, p.w * 4, p.b * 4, p.nOutP, os * 4);
    if (withGelu) this.fn.gelu(os * 4, n * p.nOutP);
    const m = this.view();
    for (let r = 0; r < n; r++) {
      const o = os + r * p.nOutP, d = r * p.nOut;
      if (add) for (let j = 0; j < p.nOut; j++) out[d + j] += m[o + j];
      else out.set(m.subarray(o, o + p.nOut), d);
    }
  }

  /** The recurrence of `Model.layers` for n images of T positions: qkv (N*T, 3D) as the product
   * wrote it (phi is applied to q and k here), the state's S and z at offsets S, z (N, H, E, E) and
   * (N, H, E); att (N*T, D) out. */
  attend(qkv, n, T, S, z, att, H, E, eps) {
    const D = H * E, qs = this.scratch("qkv", n * T * 3 * D), as = this.scratch("att", n * T * D);
    this.view().set(qkv.subarray(0, n * T * 3 * D), qs);
    this.fn.phi(qs * 4, n * T, 2 * D, 3 * D);
    this.fn.attend(qs * 4, n, T, S * 4, z * 4, as * 4, H, E, eps);
    att.set(this.view().subarray(as, as + n * T * D));
  }
}

/** sum_i x[xo + i] * w[wo + i] over i < m, four partial sums (independent additions). */
function dot(x, xo, w, wo, m) {
  let s0 = 0, s1 = 0, s2 = 0, s3 = 0, i = 0;
  for (; i + 3 < m; i += 4) {
    s0 += x[xo + i] * w[wo + i];
    s1 += x[xo + i + 1] * w[wo + i + 1];
    s2 += x[xo + i + 2] * w[wo + i + 2];
    s3 += x[xo + i + 3] * w[wo + i + 3];
  }
  for (; i < m; i++) s0 += x[xo + i] * w[wo + i];
  return (s0 + s1) + (s2 + s3);
}

/** y (N, D) = LayerNorm(x) with weight w, bias b (biased variance, as torch). */
function layerNorm(x, n, d, w, b, eps, y) {
  for (let r = 0; r < n; r++) {
    const o = r * d;
    let mean = 0;
    for (let i = 0; i < d; i++) mean += x[o + i];
    mean /= d;
    let v = 0;
    for (let i = 0; i < d; i++) { const c = x[o + i] - mean; v += c * c; }
    const inv = 1 / Math.sqrt(v / d + eps);
    for (let i = 0; i < d; i++) y[o + i] = (x[o + i] - mean) * inv * w[i] + b[i];
  }
}

/** erf to ~1e-7 absolute (Abramowitz & Stegun 7.1.26): JavaScript has no Math.erf. */
export function erf(x) {
  const s = x < 0 ? -1 : 1, a = Math.abs(x), t = 1 / (1 + 0.3275911 * a);
  const poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
  return s * (1 - poly * Math.exp(-a * a));
}

export const phi = (x) => (x > 0 ? x + 1 : Math.exp(x));   // elu(x) + 1

/** GELU in place on x[0..k): x (1 + erf(x / sqrt 2)) / 2. The reference for WasmKernels' gelu. */
export function gelu(x, k) {
  for (let i = 0; i < k; i++) x[i] = 0.5 * x[i] * (1 + erf(x[i] * Math.SQRT1_2));
}

export class Model {
  /** config: config.json written by imagegen-export; tensors: parseSafetensors(model.safetensors);
   * wasm: a WasmKernels to run the products and the attention on, or null (JavaScript's). */
  constructor(config, tensors, wasm = null) {
    const get = (name) => {
      if (!(name in tensors)) throw new Error(`model.safetensors has no tensor ${name}`);
      return tensors[name];
    };
    const linear = (name) => {   // a Dense layer's weight (I, O) and bias, as `product` takes them
      const w = get(name + ".weight"), b = get(name + ".bias").data, [nIn, nOut] = w.shape;
      return wasm ? {packed: wasm.pack(w.data, b, nIn, nOut)} : {Wt: transposed(w), b, nIn, nOut};
    };
    this.config = config;
    this.wasm = wasm;
    this.engine = wasm ? "WebAssembly SIMD" : "JavaScript";
    const c = config;
    this.D = c.d_model; this.H = c.n_heads; this.E = c.d_model / c.n_heads; this.F = c.d_ff; this.P = c.head_params;
    this.wasmAttention = wasm !== null && this.E % 4 === 0;     // attend's rows are whole f32x4 vectors
    this.length = c.length; this.channels = c.channels; this.width = c.width;
    this.C = c.num_classes || 0;                   // class-conditional: label.weight (C + 1, D), row C = no label
    this.tok = get("tok.weight").data; this.row = get("row.weight").data;
    this.col = get("col.weight").data; this.chan = get("chan.weight").data;
    this.label = this.C ? get("label.weight").data : null;
    this.context = c.context || [];                // sub-pixel distances whose bytes add ctx.<i>.weight (257, D)
    this.ctx = this.context.map((_, i) => get(`ctx.${i}.weight`).data);
    this.blocks = [];
    for (let l = 0; l < c.n_layers; l++) {
      const p = `blocks.${l}.`, d = (n) => get(p + n).data;
      this.blocks.push({
        ln1w: d("ln1.weight"), ln1b: d("ln1.bias"), ln2w: d("ln2.weight"), ln2b: d("ln2.bias"),
        qkv: linear(p + "attn.qkv"), out: linear(p + "attn.out"), ff1: linear(p + "ff.0"), ff2: linear(p + "ff.2"),
      });
    }
    this.lnfw = get("ln_f.weight").data; this.lnfb = get("ln_f.bias").data;
    this.proj = linear("proj");
  }

  /** out (N, O) = x (N, I) @ W + b for a layer made by the constructor's `linear`; add=true adds;
   * withGelu=true: out = GELU(x @ W + b) instead. */
  product(layer, x, n, out, add, withGelu = false) {
    if (layer.packed) return this.wasm.dense(x, n, layer.packed, out, add, withGelu);
    dense(x, n, layer.nIn, layer.Wt, layer.b, layer.nOut, out, add);
    if (withGelu) gelu(out, n * layer.nOut);
  }

  /** Decoding state for n images: per layer S (N, H, E, E) and z (N, H, E), each image's label row
   * (0..C-1, or C = no label; labels (N) of -1 or null mean C), plus scratch buffers for `rows` rows.
   * With the WebAssembly attention, S and z are offsets into its memory: hand the state back with
   * `release` when done with it. */
  init(n, labels = null, rows = n) {
    const {D, H, E, F, P, C} = this;
    const classes = new Int32Array(n).fill(C);
    if (labels) {
      labels.forEach((y, r) => {
        if (!(Number.isInteger(y) && y >= -1 && y < Math.max(C, 1)) || (y >= 0 && !C))
          throw new Error(C ? `labels must be class numbers in 0..${C - 1} (or -1 for none), got ${y}`
            : "this model is unconditional (trained without labels); leave the class at any");
        classes[r] = y < 0 ? C : y;
      });
    }
    return {
      n, t: 0, classes,
      S: this.blocks.map(() => (this.wasmAttention ? this.wasm.alloc(n * H * E * E) : new Float32Array(n * H * E * E))),
      z: this.blocks.map(() => (this.wasmAttention ? this.wasm.alloc(n * H * E) : new Float32Array(n * H * E))),
      seq: this.context.length ? new Int32Array(n * this.length) : null,   // the token read at each position
      h: new Float32Array(rows * D), a: new Float32Array(rows * D), att: new Float32Array(rows * D),
      qkv: new Float32Array(rows * 3 * D), ff: new Float32Array(rows * F), params: new Float32Array(n * P),
    };
  }

  /** One position for all images: tokens (N) = the bytes at t-1 (256 = START at t = 0).
   * Fills state.params (N, P); advances state.t. */
  step(tokens, s) {
    this.embed(tokens, s, 1);
    this.layers(s, 1);
    const {D} = this, n = s.n;
    layerNorm(s.h, n, D, this.lnfw, this.lnfb, this.config.ln_eps, s.a);
    this.product(this.proj, s.a, n, s.params, false);
    s.t++;
  }

  /** T positions at once for all images, feeding the state without drawing (a given prefix):
   * tokens (N, T), image-major, = the bytes at t-1 .. t+T-2 (START first at t = 0). The products
   * run over all N*T rows together; the attention's recurrence runs position by position, so
   * the state equals T calls of `step`. Needs init(n, labels, rows >= N*T). Advances state.t by T. */
  prefill(tokens, T, s) {
    if (s.h.length < s.n * T * this.D) throw new Error(`prefill of ${T} positions needs init(n, labels, ${s.n * T})`);
    this.embed(tokens, s, T);
    this.layers(s, T);
    s.t += T;
  }

  /** s.h (N*T, D) = tok + row + col + chan (+ the image's class vector, + each context distance o's
   * embedding of the byte o back: the token read at t - o + 1, START before the image) at positions
   * s.t .. s.t+T-1. */
  embed(tokens, s, T) {
    const {D} = this, L = this.length, n = s.n;
    for (let r = 0; r < n; r++) {
      const lab = this.label ? s.classes[r] * D : 0;
      for (let k = 0; k < T; k++) {
        const t = s.t + k, pixel = Math.floor(t / this.channels), o = (r * T + k) * D;
        const rowE = Math.floor(pixel / this.width) * D, colE = (pixel % this.width) * D, chanE = (t % this.channels) * D;
        const tokE = tokens[r * T + k] * D;
        for (let i = 0; i < D; i++) {
          const e = this.tok[tokE + i] + this.row[rowE + i] + this.col[colE + i] + this.chan[chanE + i];
          s.h[o + i] = this.label ? e + this.label[lab + i] : e;
        }
        if (!s.seq) continue;
        s.seq[r * L + t] = tokens[r * T + k];
        this.context.forEach((dist, j) => {
          const p = t - dist + 1, at = (p >= 0 ? s.seq[r * L + p] : 256) * D, emb = this.ctx[j];
          for (let i = 0; i < D; i++) s.h[o + i] += emb[at + i];
        });
      }
    }
  }

  /** The blocks over s.h (N*T rows; image r's positions s.t.. are rows r*T .. r*T+T-1). */
  layers(s, T) {
    const {D, H, E} = this, n = s.n, m = n * T, eps = this.config.ln_eps, attEps = this.config.attention_eps;
    this.blocks.forEach((b, l) => {
      layerNorm(s.h, m, D, b.ln1w, b.ln1b, eps, s.a);
      this.product(b.qkv, s.a, m, s.qkv, false);
      if (this.wasmAttention) this.wasm.attend(s.qkv, n, T, s.S[l], s.z[l], s.att, H, E, attEps);
      else this.attend(s, l, T, attEps);
      this.product(b.out, s.att, m, s.h, true);                    // h += attention
      layerNorm(s.h, m, D, b.ln2w, b.ln2b, eps, s.a);
      this.product(b.ff1, s.a, m, s.ff, false, true);              // GELU(ff1)
      this.product(b.ff2, s.ff, m, s.h, true);                     // h += feed-forward
    });
  }

  /** The attention's recurrence in JavaScript (layer l, T positions per image): s.att from s.qkv,
   * updating s.S[l], s.z[l]. The reference for WasmKernels.attend. */
  attend(s, l, T, attEps) {
    const {D, H, E} = this, n = s.n, S = s.S[l], z = s.z[l], qkv = s.qkv, att = s.att;
    for (let r = 0; r < n; r++) {
      for (let hh = 0; hh < H; hh++) {
        const so = (r * H + hh) * E * E, zo = (r * H + hh) * E;
        for (let k = 0; k < T; k++) {              // the recurrence, position by position
          const row = r * T + k, q = row * 3 * D + hh * E, kk = q + D, v = q + 2 * D, out = row * D + hh * E;
          for (let i = 0; i < E; i++) {            // S += phi(k) v^T, z += phi(k)
            const pk = phi(qkv[kk + i]), si = so + i * E;
            z[zo + i] += pk;
            for (let j = 0; j < E; j++) S[si + j] += pk * qkv[v + j];
          }
          let den = 0;
          for (let j = 0; j < E; j++) att[out + j] = 0;
          for (let i = 0; i < E; i++) {            // phi(q) S and phi(q) z
            const pq = phi(qkv[q + i]), si = so + i * E;
            den += pq * z[zo + i];
            for (let j = 0; j < E; j++) att[out + j] += pq * S[si + j];
          }
          const inv = 1 / (den + attEps);
          for (let j = 0; j < E; j++) att[out + j] *= inv;
        }
      }
    }
  }

  /** Copy image `from`'s decoding state (S, z per layer, the bytes read) in state `src` to image `to` in `dst`. */
  copyState(src, from, dst, to) {
    const {H, E} = this, sS = H * E * E, sZ = H * E;
    const copy = (a, b, k) => {                 // image `from` of a -> image `to` of b, k floats each
      if (!this.wasmAttention) b.set(a.subarray(from * k, (from + 1) * k), to * k);
      else this.wasm.view().copyWithin(b + to * k, a + from * k, a + (from + 1) * k);
    };
    src.S.forEach((S, l) => copy(S, dst.S[l], sS));
    src.z.forEach((z, l) => copy(z, dst.z[l], sZ));
    if (src.seq) dst.seq.set(src.seq.subarray(from * this.length, (from + 1) * this.length), to * this.length);
  }

  /** Hand back what `init` took from the WebAssembly memory (nothing to do in JavaScript). */
  release(s) {
    if (!this.wasmAttention) return;
    const {H, E} = this;
    s.S.forEach((at) => this.wasm.free(at, s.n * H * E * E));
    s.z.forEach((at) => this.wasm.free(at, s.n * H * E));
    s.S = s.z = [];
  }
}
