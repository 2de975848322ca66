// The linear transformer as an RNN in float32 typed arrays: the arithmetic of
// imagegen.model.PixelTransformer.step (embeddings, pre-LN blocks, linear attention with
// phi = elu + 1 and per-head state S (E x E) and z (E), exact-GELU feed-forward, ln_f, proj)
// and the inverse-CDF draw of imagegen.likelihood.sample. N images step together, so each
// weight row is read from memory once per step for the whole batch.
// Shape letters: N images, D model dim, H heads, E head dim, F feed-forward dim, P head params.
// No DOM, no network: the worker (worker.js) and tests import it.

/** Parse a safetensors file (8-byte LE header length, JSON header, raw LE tensors): {name: {shape, data}}. */
export function parseSafetensors(buffer) {
  const view = new DataView(buffer);
  const headerLength = Number(view.getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 8, headerLength)));
  const start = 8 + headerLength, tensors = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    if (info.dtype !== "F32") throw new Error(`tensor ${name} is ${info.dtype}; the page reads F32 only`);
    const [a, b] = info.data_offsets;
    tensors[name] = {shape: info.shape, data: new Float32Array(buffer.slice(start + a, start + b))};
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

/** out (N, nOut) = x (N, nIn) @ W + b, with Wt (nOut, nIn); add=true adds to out instead. */
function dense(x, n, nIn, Wt, b, nOut, out, add) {
  for (let j = 0; j < nOut; j++) {
    const row = j * nIn, bias = b[j];
    for (let r = 0; r < n; r++) {
      const xo = r * nIn;
      let s0 = 0, s1 = 0, s2 = 0, s3 = 0, i = 0;
      for (; i + 3 < nIn; i += 4) {
        s0 += x[xo + i] * Wt[row + i];
        s1 += x[xo + i + 1] * Wt[row + i + 1];
        s2 += x[xo + i + 2] * Wt[row + i + 2];
        s3 += x[xo + i + 3] * Wt[row + i + 3];
      }
      for (; i < nIn; i++) s0 += x[xo + i] * Wt[row + i];
      const o = r * nOut + j;
      out[o] = (add ? out[o] : 0) + bias + ((s0 + s1) + (s2 + s3));
    }
  }
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

const phi = (x) => (x > 0 ? x + 1 : Math.exp(x));   // elu(x) + 1

export class Model {
  /** config: config.json written by imagegen-export; tensors: parseSafetensors(model.safetensors). */
  constructor(config, tensors) {
    const get = (name) => {
      if (!(name in tensors)) throw new Error(`model.safetensors has no tensor ${name}`);
      return tensors[name];
    };
    this.config = config;
    const c = config;
    this.D = c.d_model; this.H = c.n_heads; this.E = c.d_model / c.n_heads; this.F = c.d_ff; this.P = c.n_params;
    this.length = c.length; this.channels = c.channels; this.width = c.width;
    this.tok = get("tok.weight").data; this.row = get("row.weight").data;
    this.col = get("col.weight").data; this.chan = get("chan.weight").data;
    this.blocks = [];
    for (let l = 0; l < c.n_layers; l++) {
      const p = `blocks.${l}.`, d = (n) => get(p + n).data;
      this.blocks.push({
        ln1w: d("ln1.weight"), ln1b: d("ln1.bias"), ln2w: d("ln2.weight"), ln2b: d("ln2.bias"),
        qkv: transposed(get(p + "attn.qkv.weight")), qkvb: d("attn.qkv.bias"),
        out: transposed(get(p + "attn.out.weight")), outb: d("attn.out.bias"),
        ff1: transposed(get(p + "ff.0.weight")), ff1b: d("ff.0.bias"),
        ff2: transposed(get(p + "ff.2.weight")), ff2b: d("ff.2.bias"),
      });
    }
    this.lnfw = get("ln_f.weight").data; this.lnfb = get("ln_f.bias").data;
    this.proj = transposed(get("proj.weight")); this.projb = get("proj.bias").data;
  }

  /** Decoding state for n images: per layer S (N, H, E, E) and z (N, H, E), plus scratch buffers. */
  init(n) {
    const {D, H, E, F, P} = this;
    return {
      n, t: 0,
      S: this.blocks.map(() => new Float32Array(n * H * E * E)),
      z: this.blocks.map(() => new Float32Array(n * H * E)),
      h: new Float32Array(n * D), a: new Float32Array(n * D), att: new Float32Array(n * D),
      qkv: new Float32Array(n * 3 * D), ff: new Float32Array(n * F), params: new Float32Array(n * P),
    };
  }

  /** One position for all images: tokens (N) = the bytes at t-1 (256 = START at t = 0).
   * Fills state.params (N, P) unless head = false (a given prefix needs no head); advances state.t. */
  step(tokens, s, head = true) {
    const {D, H, E, F, P} = this, n = s.n, t = s.t, eps = this.config.ln_eps;
    const pixel = Math.floor(t / this.channels);
    const rowE = Math.floor(pixel / this.width) * D, colE = (pixel % this.width) * D, chanE = (t % this.channels) * D;
    for (let r = 0; r < n; r++) {
      const tokE = tokens[r] * D, o = r * D;
      for (let i = 0; i < D; i++) s.h[o + i] = this.tok[tokE + i] + this.row[rowE + i] + this.col[colE + i] + this.chan[chanE + i];
    }
    const attEps = this.config.attention_eps;
    this.blocks.forEach((b, l) => {
      layerNorm(s.h, n, D, b.ln1w, b.ln1b, eps, s.a);
      dense(s.a, n, D, b.qkv, b.qkvb, 3 * D, s.qkv, false);
      const S = s.S[l], z = s.z[l], qkv = s.qkv, att = s.att;
      for (let r = 0; r < n; r++) {
        for (let hh = 0; hh < H; hh++) {
          const q = r * 3 * D + hh * E, k = q + D, v = q + 2 * D;
          const so = (r * H + hh) * E * E, zo = (r * H + hh) * E, out = r * D + hh * E;
          for (let i = 0; i < E; i++) {            // S += phi(k) v^T, z += phi(k)
            const pk = phi(qkv[k + i]), si = so + i * E;
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
      dense(att, n, D, b.out, b.outb, D, s.h, true);               // h += attention
      layerNorm(s.h, n, D, b.ln2w, b.ln2b, eps, s.a);
      dense(s.a, n, D, b.ff1, b.ff1b, F, s.ff, false);
      for (let i = 0; i < n * F; i++) { const x = s.ff[i]; s.ff[i] = 0.5 * x * (1 + erf(x * Math.SQRT1_2)); }
      dense(s.ff, n, F, b.ff2, b.ff2b, D, s.h, true);              // h += feed-forward
    });
    if (head) {
      layerNorm(s.h, n, D, this.lnfw, this.lnfb, eps, s.a);
      dense(s.a, n, D, this.proj, this.projb, P, s.params, false);
    }
    s.t++;
  }
}

const EDGES = Array.from({length: 255}, (_, i) => (i + 0.5) / 127.5 - 1);   // inner bin edges on [-1, 1]

/** Probabilities of the 256 byte values (Float64Array) from one image's parameters (P values at
 * params[off..]): softmax of 256 logits, or the discretized logistic mixture's CDF at the inner
 * bin edges, differenced (imagegen.likelihood's `probs`); sharpened as p^(1/temperature). */
export function probs(config, params, off, temperature) {
  const p = new Float64Array(256);
  if (config.head === "categorical") {
    let m = -Infinity, sum = 0;
    for (let i = 0; i < 256; i++) m = Math.max(m, params[off + i]);
    for (let i = 0; i < 256; i++) { p[i] = Math.exp(params[off + i] - m); sum += p[i]; }
    for (let i = 0; i < 256; i++) p[i] /= sum;
  } else {
    const K = config.n_mixtures, w = new Float64Array(K);
    let m = -Infinity, sum = 0;
    for (let k = 0; k < K; k++) m = Math.max(m, params[off + k]);
    for (let k = 0; k < K; k++) { w[k] = Math.exp(params[off + k] - m); sum += w[k]; }
    let prev = 0;
    for (let e = 0; e < 255; e++) {
      let cdf = 0;
      for (let k = 0; k < K; k++) {
        const mean = params[off + K + k], invS = Math.exp(-Math.max(params[off + 2 * K + k], config.min_log_scale));
        cdf += (w[k] / sum) / (1 + Math.exp(-(EDGES[e] - mean) * invS));
      }
      p[e] = cdf - prev;
      prev = cdf;
    }
    p[255] = 1 - prev;
  }
  if (temperature !== 1) {
    let m = -Infinity, sum = 0;
    for (let i = 0; i < 256; i++) { p[i] = Math.log(p[i]) / temperature; m = Math.max(m, p[i]); }
    for (let i = 0; i < 256; i++) { p[i] = Math.exp(p[i] - m); sum += p[i]; }
    for (let i = 0; i < 256; i++) p[i] /= sum;
  }
  return p;
}

/** Inverse CDF: the first byte whose cumulative probability reaches u * total, u in [0, 1). */
export function draw(p, u) {
  const cdf = new Float64Array(256);
  let c = 0;
  for (let i = 0; i < 256; i++) { c += p[i]; cdf[i] = c; }
  const target = u * c;
  for (let i = 0; i < 256; i++) if (cdf[i] >= target) return i;
  return 255;
}

/** A seeded uniform generator on [0, 1) (mulberry32): the page's own draws. Its seeds do not
 * reproduce torch's; explicit uniforms do. */
export function uniformGenerator(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
