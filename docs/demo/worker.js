// Web Worker: loads the exported model and runs the sampling loop off the page's thread.
// Messages in:  {type: "run", id, n, seed, temperature, uniforms (N*L or null), prefix (N*start or null),
//                start, recordParams, labels (N class numbers, -1 none, or null), guidance}
//               | {type: "bench", id, n, steps, warmup, engine ("js": JavaScript alone even where
//                 WebAssembly SIMD runs)} | {type: "cancel", id}
// Messages out: {type: "ready", config, engine}
//               | {type: "rows", id, t0, t1, bytes (N*(t1-t0)), row, rows, msPerStep, prefixMs}
//               | {type: "done", id, bytes, params, msPerStep, prefixMs, seconds, rows}
//               | {type: "bench", id, msPerStep, engine}
//               | {type: "error", message}
// msPerStep: per sampled position (the prefix is fed in one pass beforehand, prefixMs); row/rows count
// the image rows sampled, not the given ones.
import {draw, probs, uniformGenerator} from "./draw.js";
import {Model, WasmKernels, parseSafetensors} from "./sampler.js";

let model = null, current = 0, jsModel = null;
const weightsFile = () => fetch("model.safetensors").then((r) => r.arrayBuffer());

async function load() {
  const [config, weights, wasm] = await Promise.all([
    fetch("config.json").then((r) => r.json()),
    weightsFile(),
    // the SIMD kernels; without them (a site exported before them, a browser without SIMD) JavaScript's
    fetch("kernels.wasm").then((r) => (r.ok ? r.arrayBuffer() : null)).catch(() => null),
  ]);
  model = new Model(config, parseSafetensors(weights), WasmKernels.create(wasm && new Uint8Array(wasm)));
  postMessage({type: "ready", config, engine: model.engine});
}

// Yield to the message queue between rows, so that a newer request can cancel this one.
const channel = new MessageChannel();
const yieldNow = () => new Promise((resolve) => { channel.port1.onmessage = resolve; channel.port2.postMessage(0); });

/** The batch the model runs: image r's label row (0..C-1, -1 none) for r < n, and with guidance
 * (G != 1, labels given, conditional model) the unconditional branch as images n..2n-1. */
function branches(n, labels, guidance) {
  const guide = model.C > 0 && labels != null && guidance !== 1;
  const rows = labels == null ? null : Array.from(labels);
  return {guide, labels: guide ? rows.concat(Array(n).fill(-1)) : rows, B: guide ? 2 * n : n};
}

/** Feed the given prefix (N*start bytes) into `state` (B rows; row r reads image r mod n) in one
 * pass: rows with the same label and prefix share one run of `Model.prefill`, whose products take
 * all positions together (in chunks of at most ROWS rows), then its state is copied to them. */
const ROWS = 2048;
function feedPrefix(state, runLabels, n, prefix, start) {
  const B = state.n, keyOf = new Map(), unique = [];
  const rowOf = Array.from({length: B}, (_, r) => {
    const img = r % n, label = runLabels ? runLabels[r] : -1;
    const key = label + ":" + prefix.subarray(img * start, (img + 1) * start).join(",");
    if (!keyOf.has(key)) { keyOf.set(key, unique.length); unique.push({img, label}); }
    return keyOf.get(key);
  });
  const U = unique.length, T = Math.max(1, Math.min(start, Math.floor(ROWS / U)));
  const shared = model.init(U, runLabels ? unique.map((u) => u.label) : null, U * T);
  for (let t0 = 0; t0 < start; t0 += T) {
    const k = Math.min(T, start - t0), tokens = new Int32Array(U * k);
    unique.forEach(({img}, u) => {
      for (let j = 0; j < k; j++) { const t = t0 + j; tokens[u * k + j] = t === 0 ? 256 : prefix[img * start + t - 1]; }
    });
    model.prefill(tokens, k, shared);
  }
  rowOf.forEach((u, r) => model.copyState(shared, u, state, r));
  model.release(shared);
  state.t = start;
  return U;
}

async function run(request) {
  const {guide, labels: runLabels, B} = branches(request.n, request.labels, request.guidance);
  const state = model.init(B, runLabels);
  try {
    await sample(request, state, guide, runLabels);
  } finally {
    model.release(state);
  }
}

/** Sample into `state` (B rows, made by `run`): the prefix fed, then row by row to the end. */
async function sample({id, n, seed, temperature, uniforms, prefix, start, recordParams, guidance}, state, guide,
                      runLabels) {
  const L = model.length, P = model.P, cfg = model.config, rowLen = model.width * model.channels, B = state.n;
  const x = new Uint8Array(n * L), tokens = new Int32Array(B);
  const params = recordParams ? new Float32Array(n * L * P) : null;
  const rand = uniformGenerator(seed);
  const rows = Math.ceil((L - start) / rowLen);   // image rows actually sampled (a completion: the hidden part)
  for (let r = 0; r < n; r++) for (let t = 0; t < start; t++) x[r * L + t] = prefix[r * start + t];
  const t0 = performance.now();
  if (start) feedPrefix(state, runLabels, n, prefix, start);
  const t1 = performance.now();
  let rowStart = start;
  for (let t = start; t < L; t++) {
    for (let r = 0; r < B; r++) { const img = r % n; tokens[r] = t === 0 ? 256 : x[img * L + t - 1]; }
    model.step(tokens, state);
    for (let r = 0; r < n; r++) {
      const u = uniforms ? uniforms[r * L + t] : rand();
      x[r * L + t] = draw(probs(cfg, state.params, r * P, temperature, guide ? (r + n) * P : -1, guidance), u);
    }
    if (params) for (let r = 0; r < n; r++) params.set(state.params.subarray(r * P, (r + 1) * P), (r * L + t) * P);
    if ((t + 1 - start) % rowLen === 0 || t === L - 1) {
      const bytes = new Uint8Array(n * (t + 1 - rowStart));
      for (let r = 0; r < n; r++) bytes.set(x.subarray(r * L + rowStart, r * L + t + 1), r * (t + 1 - rowStart));
      postMessage({type: "rows", id, t0: rowStart, t1: t + 1, bytes, row: Math.ceil((t + 1 - start) / rowLen), rows,
                   msPerStep: (performance.now() - t1) / (t + 1 - start), prefixMs: t1 - t0});
      rowStart = t + 1;
      await yieldNow();
      if (id !== current) return;                   // cancelled by a newer request
    }
  }
  const now = performance.now();
  postMessage({type: "done", id, bytes: x, params, msPerStep: (now - t1) / Math.max(1, L - start), prefixMs: t1 - t0,
               seconds: (now - t0) / 1000, rows});
}

/** ms per step (model step and draws) for n images, timed over `steps` positions after `warmup`;
 * engine "js" times JavaScript alone (a second model, made on first use). */
async function bench({id, n, steps, warmup, engine}) {
  if (engine === "js" && !jsModel)
    jsModel = model.wasm ? new Model(model.config, parseSafetensors(await weightsFile())) : model;
  const m = engine === "js" ? jsModel : model;
  const state = m.init(n), tokens = new Int32Array(n), rand = uniformGenerator(0);
  const once = () => {
    if (state.t === m.length) state.t = 0;         // constant work per step: wrap around
    for (let r = 0; r < n; r++) tokens[r] = Math.floor(rand() * 256);
    m.step(tokens, state);
    for (let r = 0; r < n; r++) draw(probs(m.config, state.params, r * m.P, 1), rand());
  };
  for (let i = 0; i < warmup; i++) once();
  const t0 = performance.now();
  for (let i = 0; i < steps; i++) once();
  const msPerStep = (performance.now() - t0) / steps;
  m.release(state);
  postMessage({type: "bench", id, msPerStep, engine: m.engine});
}

const loaded = load().catch((e) => postMessage({type: "error", message: `could not load the model: ${e.message}`}));
onmessage = async ({data}) => {
  await loaded;
  current = data.id;
  if (data.type === "cancel") return;
  try {
    if (data.type === "run") await run(data);
    else if (data.type === "bench") await bench(data);
  } catch (e) {
    postMessage({type: "error", id: data.id, message: e.message});
  }
};
