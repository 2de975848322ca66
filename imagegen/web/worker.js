// Web Worker: loads the exported model and runs the sampling loop off the page's thread.
// Messages in:  {type: "run", id, n, seed, temperature, uniforms (N*L or null), prefix (N*start or null),
//                start, recordParams} | {type: "bench", id, n, steps, warmup}
// Messages out: {type: "ready", config} | {type: "rows", id, t0, t1, bytes (N*(t1-t0)), msPerStep}
//               | {type: "done", id, bytes, params, msPerStep} | {type: "bench", id, msPerStep} | {type: "error", message}
import {Model, draw, parseSafetensors, probs, uniformGenerator} from "./sampler.js";

let model = null, current = 0;

async function load() {
  const [config, weights] = await Promise.all([
    fetch("config.json").then((r) => r.json()),
    fetch("model.safetensors").then((r) => r.arrayBuffer()),
  ]);
  model = new Model(config, parseSafetensors(weights));
  postMessage({type: "ready", config});
}

// Yield to the message queue between rows, so that a newer request can cancel this one.
const channel = new MessageChannel();
const yieldNow = () => new Promise((resolve) => { channel.port1.onmessage = resolve; channel.port2.postMessage(0); });

async function run({id, n, seed, temperature, uniforms, prefix, start, recordParams}) {
  const L = model.length, P = model.P, cfg = model.config, rowLen = model.width * model.channels;
  const x = new Uint8Array(n * L), tokens = new Int32Array(n), state = model.init(n);
  const params = recordParams ? new Float32Array(n * L * P) : null;
  const rand = uniformGenerator(seed);
  for (let r = 0; r < n; r++) for (let t = 0; t < start; t++) x[r * L + t] = prefix[r * start + t];
  const t0 = performance.now();
  let rowStart = 0;
  for (let t = 0; t < L; t++) {
    for (let r = 0; r < n; r++) tokens[r] = t === 0 ? 256 : x[r * L + t - 1];
    model.step(tokens, state, t >= start);
    if (t >= start) {
      for (let r = 0; r < n; r++) {
        const u = uniforms ? uniforms[r * L + t] : rand();
        x[r * L + t] = draw(probs(cfg, state.params, r * P, temperature), u);
      }
      if (params) for (let r = 0; r < n; r++) params.set(state.params.subarray(r * P, (r + 1) * P), (r * L + t) * P);
    }
    if ((t + 1) % rowLen === 0 || t === L - 1) {
      const bytes = new Uint8Array(n * (t + 1 - rowStart));
      for (let r = 0; r < n; r++) bytes.set(x.subarray(r * L + rowStart, r * L + t + 1), r * (t + 1 - rowStart));
      postMessage({type: "rows", id, t0: rowStart, t1: t + 1, bytes, msPerStep: (performance.now() - t0) / (t + 1)});
      rowStart = t + 1;
      await yieldNow();
      if (id !== current) return;                   // cancelled by a newer request
    }
  }
  postMessage({type: "done", id, bytes: x, params, msPerStep: (performance.now() - t0) / L});
}

/** ms per step (model step and draws) for n images, timed over `steps` positions after `warmup`. */
function bench({id, n, steps, warmup}) {
  const state = model.init(n), tokens = new Int32Array(n), rand = uniformGenerator(0);
  const once = () => {
    if (state.t === model.length) state.t = 0;     // constant work per step: wrap around
    for (let r = 0; r < n; r++) tokens[r] = Math.floor(rand() * 256);
    model.step(tokens, state);
    for (let r = 0; r < n; r++) draw(probs(model.config, state.params, r * model.P, 1), rand());
  };
  for (let i = 0; i < warmup; i++) once();
  const t0 = performance.now();
  for (let i = 0; i < steps; i++) once();
  postMessage({type: "bench", id, msPerStep: (performance.now() - t0) / steps});
}

const loaded = load().catch((e) => postMessage({type: "error", message: `could not load the model: ${e.message}`}));
onmessage = async ({data}) => {
  await loaded;
  current = data.id;
  try {
    if (data.type === "run") await run(data);
    else if (data.type === "bench") bench(data);
  } catch (e) {
    postMessage({type: "error", id: data.id, message: e.message});
  }
};
