// The heads' probabilities of the 256 byte values (imagegen.model.heads: categorical softmax or the
// discretized logistic mixture, bounded guidance) and the seeded inverse-CDF draw of heads.sample.
// No DOM, no network: the worker (worker.js) and tests import it.

const EDGES = Array.from({length: 255}, (_, i) => (i + 0.5) / 127.5 - 1);   // inner bin edges on [-1, 1]

/** Probabilities of the 256 byte values (Float64Array) from one image's parameters (P values at
 * params[off..]): softmax of 256 logits, or the discretized logistic mixture's CDF at the inner
 * bin edges, differenced (the head's `probs` in imagegen.model.heads). */
export function headProbs(config, params, off) {
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
  return p;
}

const TINY = 2 ** -126;   // float32's smallest normal, where heads.guided_probs clamps
const GUIDANCE_BOUND = 0.5;   // heads.GUIDANCE_BOUND: above G = 1 the log-ratio is clamped to [-B, B]

/** p (256) to draw from, as imagegen.model.heads.sample: the head's probabilities at params[off..],
 * with classifier-free guidance G (offUncond: the unconditional branch's parameters, or -1) as
 * heads.guided_probs: log p_c + (G - 1) (log p_c - log p_u), the log-ratio clamped to
 * [-B, B] when G > 1, normalised; then sharpened as p^(1/temperature). */
export function probs(config, params, off, temperature, offUncond = -1, guidance = 1) {
  let p = headProbs(config, params, off);
  if (offUncond >= 0 && guidance !== 1) {
    const pu = headProbs(config, params, offUncond), bound = guidance > 1 ? GUIDANCE_BOUND : Infinity;
    for (let i = 0; i < 256; i++) {
      const logC = Math.log(Math.max(p[i], TINY)), ratio = logC - Math.log(Math.max(pu[i], TINY));
      p[i] = logC + (guidance - 1) * Math.min(Math.max(ratio, -bound), bound);
    }
    p = softmax(p);
  }
  if (temperature !== 1) {
    for (let i = 0; i < 256; i++) p[i] = Math.log(p[i]) / temperature;
    p = softmax(p);
  }
  return p;
}

/** softmax of 256 logits, in place. */
function softmax(p) {
  let m = -Infinity, sum = 0;
  for (let i = 0; i < 256; i++) m = Math.max(m, p[i]);
  for (let i = 0; i < 256; i++) { p[i] = Math.exp(p[i] - m); sum += p[i]; }
  for (let i = 0; i < 256; i++) p[i] /= sum;
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
