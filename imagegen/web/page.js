// The page: controls, the grid drawn as the worker emits rows, the completion pad, and
// window.imagegen (state and a programmatic run() for tests and benchmarks).
const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
const worker = new Worker("worker.js", {type: "module"});
const PAD = 1, SCALE = 5, PAD_SCALE = 10;
let config = null, examples = null, nextId = 0, pending = null, padBytes = null;

const api = window.imagegen = {
  status: "loading", error: null, config: null, n: 0, row: 0, bytes: null, params: null,
  msPerStep: null, imagesPerSec: null,
  /** Sample: opts {n, seed, temperature, uniforms (n*L numbers in [0, 1), image-major, or null), prefix
   * (one list of bytes kept in every image, or n lists), recordParams, cols}. Resolves to
   * {bytes (n lists of L bytes), params (Float32Array n*L*P, zeros over the prefix, or null), msPerStep}. */
  run: (opts) => start(opts),
  /** ms per step for n images, timed over `steps` positions after `warmup`. */
  bench: (n, steps = 100, warmup = 10) => request({type: "bench", n, steps, warmup}),
};

function request(message) {
  if (pending) pending.reject(new Error("cancelled by a newer request"));
  const id = ++nextId;
  return new Promise((resolve, reject) => {
    pending = {id, resolve, reject};
    worker.postMessage({...message, id});
  });
}

function fail(message) {
  api.status = "error";
  api.error = message;
  $("stats").textContent = "error: " + message;
}

// ---------------------------------------------------------------- the grid
let grid = null;   // {n, cols, tiles: n + extra}

function tileOrigin(i) {
  const {width: W, height: H} = config;
  return [PAD + (i % grid.cols) * (W + PAD), PAD + Math.floor(i / grid.cols) * (H + PAD)];
}

function setupGrid(tiles, cols) {
  const {width: W, height: H} = config, canvas = $("grid");
  grid = {cols, tiles, ctx: canvas.getContext("2d")};
  canvas.width = PAD + cols * (W + PAD);
  canvas.height = PAD + Math.ceil(tiles / cols) * (H + PAD);
  canvas.style.width = canvas.width * SCALE + "px";
  canvas.style.height = canvas.height * SCALE + "px";
  grid.ctx.fillStyle = "#fafafa";
  grid.ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let i = 0; i < tiles; i++) { const [x, y] = tileOrigin(i); grid.ctx.fillStyle = "#444"; grid.ctx.fillRect(x, y, W, H); }
}

/** Paint sub-pixels t0..t1 of one image (bytes[off..]) into tile i; whole pixels are repainted. */
function paint(i, image, t0, t1) {
  const {width: W, channels: C} = config, p0 = Math.floor(t0 / C), p1 = Math.ceil(t1 / C);
  const img = grid.ctx.createImageData(1, 1), [ox, oy] = tileOrigin(i);
  for (let p = p0; p < p1; p++) {
    for (let c = 0; c < 3; c++) img.data[c] = image[p * C + (C === 1 ? 0 : c)] ?? 0;
    img.data[3] = 255;
    grid.ctx.putImageData(img, ox + (p % W), oy + Math.floor(p / W));
  }
}

// ---------------------------------------------------------------- runs
let images = null, offset = 0;   // images: n Uint8Arrays being filled; offset: first tile of the samples

function start(opts = {}) {
  if (!config) return Promise.reject(new Error("the model is not loaded yet"));
  const L = config.length, n = Math.max(1, Math.min(256, Math.floor(opts.n ?? 16)));
  const temperature = Number(opts.temperature ?? 1), seed = (opts.seed ?? 0) >>> 0;
  if (!(temperature > 0)) return Promise.reject(new Error("temperature must be > 0"));
  // prefix: one list of bytes kept in every image, or a list of n such lists (same length)
  const given = !opts.prefix || !opts.prefix.length ? [] : (typeof opts.prefix[0] === "number" ? Array(n).fill(opts.prefix) : opts.prefix);
  const startAt = given.length ? given[0].length : 0, prefix = given.length ? new Uint8Array(n * startAt) : null;
  if (given.length && (given.length !== n || startAt > L || given.some((p) => p.length !== startAt)))
    return Promise.reject(new Error(`prefix must be one list of at most ${L} bytes or ${n} lists of the same length`));
  given.forEach((p, r) => prefix.set(p, r * startAt));
  const uniforms = opts.uniforms ? Float64Array.from(opts.uniforms) : null;
  if (uniforms && uniforms.length !== n * L) return Promise.reject(new Error(`uniforms must hold n * ${L} numbers`));
  images = Array.from({length: n}, () => new Uint8Array(L));
  offset = prefix && opts.showInput !== false ? 1 : 0;
  setupGrid(n + offset, Math.max(1, Math.min(n + offset, opts.cols ?? Math.ceil(Math.sqrt(n + offset)))));
  if (offset) {     // the given top half, the rest grey
    const shown = new Uint8Array(L).fill(128);
    shown.set(prefix.subarray(0, startAt));
    paint(0, shown, 0, L);
  }
  for (let r = 0; r < n; r++) { images[r].set(prefix ? prefix.subarray(r * startAt, (r + 1) * startAt) : []); if (startAt) paint(r + offset, images[r], 0, startAt); }
  Object.assign(api, {status: "sampling", error: null, n, row: 0, bytes: null, params: null, msPerStep: null, imagesPerSec: null});
  return request({type: "run", n, seed, temperature, uniforms, prefix, start: startAt, recordParams: !!opts.recordParams});
}

worker.onmessage = ({data}) => {
  if (data.type === "ready") return ready(data.config);
  if (data.type === "error" && !data.id) return fail(data.message);
  if (!pending || data.id !== pending.id) return;              // a cancelled run
  if (data.type === "rows") {
    const k = data.t1 - data.t0, L = config.length;
    images.forEach((img, r) => { img.set(data.bytes.subarray(r * k, (r + 1) * k), data.t0); paint(r + offset, img, data.t0, data.t1); });
    const rowLen = config.width * config.channels;
    api.row = Math.ceil(data.t1 / rowLen);
    api.msPerStep = data.msPerStep;
    api.imagesPerSec = images.length / (data.msPerStep * L / 1000);
    $("stats").textContent = `row ${api.row} of ${config.height} · ${data.msPerStep.toFixed(2)} ms per step for ` +
      `${images.length} images · ${api.imagesPerSec.toFixed(2)} images/sec`;
    return;
  }
  const {resolve, reject} = pending;
  pending = null;
  if (data.type === "error") { fail(data.message); reject(new Error(data.message)); return; }
  if (data.type === "bench") { resolve({msPerStep: data.msPerStep}); return; }
  const L = config.length;
  api.bytes = images.map((_, r) => Array.from(data.bytes.subarray(r * L, (r + 1) * L)));
  api.params = data.params;                                     // Float32Array (N * L * P) or null
  api.msPerStep = data.msPerStep;
  api.imagesPerSec = images.length / (data.msPerStep * L / 1000);
  api.status = "done";
  $("stats").textContent = `done: ${images.length} images · ${data.msPerStep.toFixed(2)} ms per step · ` +
    `${api.imagesPerSec.toFixed(2)} images/sec`;
  resolve({bytes: api.bytes, params: api.params, msPerStep: api.msPerStep});
};
worker.onerror = (e) => fail(`the sampler worker failed: ${e.message}`);

// ---------------------------------------------------------------- the completion pad
function keepRows() { return Math.floor(config.height / 2); }
function keepLength() { return keepRows() * config.width * config.channels; }

function drawPad() {
  const {width: W, height: H, channels: C} = config, canvas = $("pad"), ctx = canvas.getContext("2d");
  const img = ctx.createImageData(W, H);
  for (let p = 0; p < W * H; p++) {
    const hidden = Math.floor(p / W) >= keepRows();
    for (let c = 0; c < 3; c++) img.data[4 * p + c] = hidden ? 128 : padBytes[p * C + (C === 1 ? 0 : c)];
    img.data[4 * p + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
  ctx.fillStyle = "#e33";
  ctx.fillRect(0, keepRows(), W, 0.15);
}

function brush(event) {
  const {width: W, channels: C} = config, rect = $("pad").getBoundingClientRect();
  const x = (event.clientX - rect.left) / rect.width * W, y = (event.clientY - rect.top) / rect.height * config.height;
  for (let py = Math.floor(y - 2); py <= y + 2; py++) {
    for (let px = Math.floor(x - 2); px <= x + 2; px++) {
      if (py < 0 || py >= keepRows() || px < 0 || px >= W) continue;
      const d = Math.hypot(px + 0.5 - x, py + 0.5 - y), v = Math.round(255 * Math.max(0, Math.min(1, 1.6 - d)));
      for (let c = 0; c < C; c++) padBytes[(py * W + px) * C + c] = Math.max(padBytes[(py * W + px) * C + c], v);
    }
  }
  drawPad();
}

function setupPad() {
  const {width: W, height: H, channels: C} = config, canvas = $("pad");
  padBytes = new Uint8Array(config.length);
  canvas.width = W; canvas.height = H;
  canvas.style.width = W * PAD_SCALE + "px"; canvas.style.height = H * PAD_SCALE + "px";
  let down = false;
  canvas.addEventListener("pointerdown", (e) => { down = true; brush(e); });
  canvas.addEventListener("pointermove", (e) => { if (down) brush(e); });
  addEventListener("pointerup", () => { down = false; });
  $("clear").onclick = () => { padBytes.fill(0); drawPad(); };
  drawPad();
  (examples || []).forEach((ex) => {
    const thumb = document.createElement("canvas"), ctx = thumb.getContext("2d"), img = ctx.createImageData(W, H);
    thumb.width = W; thumb.height = H; thumb.style.width = 2 * W + "px";
    for (let p = 0; p < W * H; p++) { for (let c = 0; c < 3; c++) img.data[4 * p + c] = ex[p * C + (C === 1 ? 0 : c)]; img.data[4 * p + 3] = 255; }
    ctx.putImageData(img, 0, 0);
    thumb.onclick = () => { padBytes.set(ex); drawPad(); };
    $("examples").appendChild(thumb);
  });
}

// ---------------------------------------------------------------- controls
const mode = () => document.querySelector("input[name=mode]:checked").value;
function fromControls() {
  const opts = {n: +$("n").value, temperature: +$("temperature").value, seed: +$("seed").value};
  if (mode() === "complete") Object.assign(opts, {prefix: padBytes.subarray(0, keepLength()), cols: opts.n + 1});
  start(opts).catch((e) => { if (!/cancelled/.test(e.message)) fail(e.message); });
}

async function ready(cfg) {
  config = api.config = cfg;
  $("arch").textContent = `${cfg.n_layers} layers, ${cfg.n_heads} heads, d_model ${cfg.d_model}, ${cfg.head} head, ` +
    `${cfg.dataset} ${cfg.height}x${cfg.width}x${cfg.channels}`;
  if (cfg.examples) {
    const buf = new Uint8Array(await (await fetch("examples.bin")).arrayBuffer());
    examples = Array.from({length: cfg.examples}, (_, i) => buf.subarray(i * cfg.length, (i + 1) * cfg.length));
  }
  setupPad();
  for (const key of ["n", "temperature", "seed"]) if (query.has(key)) $(key).value = query.get(key);
  if (query.get("mode") === "complete") document.querySelector("input[value=complete]").checked = true;
  document.querySelectorAll("input[name=mode]").forEach((el) => el.onchange = () => {
    $("completeView").hidden = mode() !== "complete";
    $("go").textContent = mode() === "complete" ? "complete" : "sample";
  });
  $("completeView").hidden = mode() !== "complete";
  if (mode() === "complete" && examples) padBytes.set(examples[0]), drawPad();
  $("go").onclick = fromControls;
  api.status = "ready";
  $("stats").textContent = "ready";
  if (query.get("autostart") !== "0") fromControls();
}
