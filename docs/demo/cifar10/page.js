// The page: controls, the grid drawn as the worker emits rows, the completion pad, and
// window.imagegen (state and a programmatic run() for tests and benchmarks).
const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
const worker = new Worker("worker.js", {type: "module"});
const PAD = 1, SCALE = 5, PAD_SCALE = 10;
let config = null, examples = null, nextId = 0, pending = null, padBytes = null;

const api = window.imagegen = {
  status: "loading", error: null, config: null, n: 0, row: 0, rows: 0, bytes: null, params: null,
  msPerStep: null, imagesPerSec: null, engine: null,
  /** Sample: opts {n, seed, temperature, uniforms (n*L numbers in [0, 1), image-major, or null), prefix
   * (one list of bytes kept in every image, or n lists), labels (class-conditional models: one class
   * number for every image, or n of them, -1 = none; null/absent = unconditional), guidance (G, default
   * 1), recordParams, cols, rowNames}. row/rows count the image rows sampled (a completion: the hidden ones only).
   * Resolves to {bytes (n lists of L bytes), params (Float32Array n*L*P, zeros over the prefix, or null),
   * msPerStep}. */
  run: (opts) => start(opts),
  /** {msPerStep, engine} for n images, timed over `steps` positions after `warmup`; engine "js" times
   * JavaScript alone where WebAssembly SIMD would run the products and attention (api.engine: what
   * sampling runs). */
  bench: (n, steps = 100, warmup = 10, engine = null) => request({type: "bench", n, steps, warmup, engine}),
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
let grid = null;   // {cols, tiles, ctx}

function tileOrigin(i) {
  const {width: W, height: H} = config;
  return [PAD + (i % grid.cols) * (W + PAD), PAD + Math.floor(i / grid.cols) * (H + PAD)];
}

/** rowNames (one per grid row, or null): a column of names left of the grid, each centred on its row. */
function setupGrid(tiles, cols, rowNames = null) {
  const {width: W, height: H} = config, canvas = $("grid");
  if (rowNames) {
    const column = $("rowNames");
    column.hidden = false;
    column.style.paddingTop = PAD * SCALE / 2 + "px";
    for (const name of rowNames) {
      const cell = document.createElement("div");
      cell.textContent = name;
      cell.style.height = cell.style.lineHeight = (H + PAD) * SCALE + "px";
      column.append(cell);
    }
  }
  grid = {cols, tiles, ctx: canvas.getContext("2d")};
  canvas.hidden = false;
  canvas.width = PAD + cols * (W + PAD);
  canvas.height = PAD + Math.ceil(tiles / cols) * (H + PAD);
  canvas.style.width = canvas.width * SCALE + "px";     // CSS caps it at the window's width (max-width: 100%)
  grid.ctx.fillStyle = "#fafafa";
  grid.ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let i = 0; i < tiles; i++) { const [x, y] = tileOrigin(i); grid.ctx.fillStyle = "#444"; grid.ctx.fillRect(x, y, W, H); }
}

/** Remove the grid (and the given input beside it) from the page, as when the mode changes. */
function clearGrid() {
  for (const id of ["grid", "given"]) { const c = $(id); c.width = c.height = 0; c.hidden = true; }
  $("rowNames").replaceChildren();
  $("rowNames").hidden = true;
  grid = null;
}

/** Paint sub-pixels t0..t1 of one image into tile i of the grid; whole pixels are repainted. */
function paint(i, image, t0, t1) {
  const [ox, oy] = tileOrigin(i);
  paintAt(grid.ctx, ox, oy, image, t0, t1);
}

function paintAt(ctx, ox, oy, image, t0, t1) {
  const {width: W, channels: C} = config, p0 = Math.floor(t0 / C), p1 = Math.ceil(t1 / C);
  const img = ctx.createImageData(1, 1);
  for (let p = p0; p < p1; p++) {
    for (let c = 0; c < 3; c++) img.data[c] = image[p * C + (C === 1 ? 0 : c)] ?? 0;
    img.data[3] = 255;
    ctx.putImageData(img, ox + (p % W), oy + Math.floor(p / W));
  }
}

/** The given input (its top half; the rest grey) as its own tile beside the completions. */
function showGiven(prefix) {
  const {width: W, height: H, length: L} = config, canvas = $("given"), shown = new Uint8Array(L).fill(128);
  shown.set(prefix);
  canvas.hidden = false;
  canvas.width = W + 2 * PAD; canvas.height = H + 2 * PAD;
  canvas.style.width = canvas.width * SCALE + "px";
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fafafa"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  paintAt(ctx, PAD, PAD, shown, 0, L);
}

/** labels as n class numbers (-1: none), or null for none at all; throws a sentence when invalid. */
function checkLabels(labels, n) {
  if (labels === undefined || labels === null || labels === "any") return null;
  const C = config.num_classes || 0;
  if (!C) throw new Error("this model is unconditional (trained without labels): leave labels out");
  const list = typeof labels === "number" ? Array(n).fill(labels) : Array.from(labels);
  if (list.length !== n || list.some((y) => !Number.isInteger(y) || y < -1 || y >= C))
    throw new Error(`labels must be one class number or ${n} of them, each in 0..${C - 1} (-1: none)`);
  return Int32Array.from(list);
}

// ---------------------------------------------------------------- runs
let images = null, startAt = 0;   // images: n Uint8Arrays being filled; startAt: length of the given prefix

function start(opts = {}) {
  if (!config) return Promise.reject(new Error("the model is not loaded yet"));
  const L = config.length, n = Math.max(1, Math.min(256, Math.floor(opts.n ?? 16)));
  const temperature = Number(opts.temperature ?? 1), seed = (opts.seed ?? 0) >>> 0;
  if (!(temperature > 0)) return Promise.reject(new Error("temperature must be > 0"));
  // prefix: one list of bytes kept in every image, or a list of n such lists (same length)
  const given = !opts.prefix || !opts.prefix.length ? [] : (typeof opts.prefix[0] === "number" ? Array(n).fill(opts.prefix) : opts.prefix);
  const start = given.length ? given[0].length : 0, prefix = given.length ? new Uint8Array(n * start) : null;
  if (given.length && (given.length !== n || start > L || given.some((p) => p.length !== start)))
    return Promise.reject(new Error(`prefix must be one list of at most ${L} bytes or ${n} lists of the same length`));
  given.forEach((p, r) => prefix.set(p, r * start));
  const uniforms = opts.uniforms ? Float64Array.from(opts.uniforms) : null;
  if (uniforms && uniforms.length !== n * L) return Promise.reject(new Error(`uniforms must hold n * ${L} numbers`));
  const guidance = Number(opts.guidance ?? 1);
  if (!(guidance >= 0)) return Promise.reject(new Error("guidance must be >= 0 (1: the plain conditional distribution)"));
  let labels;
  try { labels = checkLabels(opts.labels, n); } catch (e) { return Promise.reject(e); }
  images = Array.from({length: n}, () => new Uint8Array(L));
  startAt = start;
  clearGrid();
  setupGrid(n, Math.max(1, Math.min(n, opts.cols ?? Math.ceil(Math.sqrt(n)))), opts.rowNames ?? null);
  if (prefix && opts.showInput !== false) showGiven(prefix.subarray(0, start));
  for (let r = 0; r < n; r++) { images[r].set(prefix ? prefix.subarray(r * start, (r + 1) * start) : []); if (start) paint(r, images[r], 0, start); }
  const rows = Math.ceil((L - start) / (config.width * config.channels));
  Object.assign(api, {status: "sampling", error: null, n, row: 0, rows, progress: [], bytes: null, params: null,
                      msPerStep: null, imagesPerSec: null});
  $("stats").textContent = start ? "reading the given part..." : "sampling...";
  return request({type: "run", n, seed, temperature, uniforms, prefix, start, recordParams: !!opts.recordParams,
                  labels, guidance});
}

worker.onmessage = ({data}) => {
  if (data.type === "ready") { api.engine = data.engine; return ready(data.config); }
  if (data.type === "error" && !data.id) return fail(data.message);
  if (!pending || data.id !== pending.id) return;              // a cancelled run
  if (data.type === "rows") {
    const k = data.t1 - data.t0, L = config.length;
    images.forEach((img, r) => { img.set(data.bytes.subarray(r * k, (r + 1) * k), data.t0); paint(r, img, data.t0, data.t1); });
    Object.assign(api, {row: data.row, rows: data.rows, msPerStep: data.msPerStep});
    api.progress.push(`row ${data.row} of ${data.rows}`);
    api.imagesPerSec = images.length / ((data.prefixMs + data.msPerStep * (L - startAt)) / 1000);   // estimate
    $("stats").textContent = `row ${data.row} of ${data.rows} · ${data.msPerStep.toFixed(2)} ms per step for ` +
      `${images.length} images · ${api.imagesPerSec.toFixed(2)} images/sec`;
    return;
  }
  const {resolve, reject} = pending;
  pending = null;
  if (data.type === "error") { fail(data.message); reject(new Error(data.message)); return; }
  if (data.type === "bench") { resolve({msPerStep: data.msPerStep, engine: data.engine}); return; }
  const L = config.length;
  api.bytes = images.map((_, r) => Array.from(data.bytes.subarray(r * L, (r + 1) * L)));
  api.params = data.params;                                     // Float32Array (N * L * P) or null
  api.msPerStep = data.msPerStep;
  api.imagesPerSec = images.length / data.seconds;
  api.status = "done";
  $("stats").textContent = `done: ${images.length} images, ${data.rows} rows sampled · ${data.msPerStep.toFixed(2)} ms per ` +
    `step · ${api.imagesPerSec.toFixed(2)} images/sec · ${api.engine}`;
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
    thumb.onclick = () => pickExample(examples.indexOf(ex));
    $("examples").appendChild(thumb);
  });
}

/** Put test image i on the pad and, for a class-conditional model, choose its own class (its top half is
 * completed as the digit it is, not as the class picked before). */
function pickExample(i) {
  padBytes.set(examples[i]);
  drawPad();
  const y = (config.example_labels || [])[i];
  if (config.num_classes && Number.isInteger(y) && y >= 0 && y < config.num_classes) {
    $("label").value = String(y);
    $("label").dispatchEvent(new Event("change"));
  }
}

// ---------------------------------------------------------------- controls
const mode = () => document.querySelector("input[name=mode]:checked").value;
function fromControls() {
  const opts = {n: +$("n").value, temperature: +$("temperature").value, seed: +$("seed").value};
  if (mode() === "complete") opts.prefix = padBytes.subarray(0, keepLength());
  const C = config.num_classes || 0, label = $("label").value;
  if (C && label !== "any") {
    opts.guidance = +$("guidance").value;
    if (label === "rows") {             // one row per class: ceil(n / C) images of each class
      const per = Math.max(1, Math.ceil(opts.n / C));
      Object.assign(opts, {n: per * C, cols: per, labels: Array.from({length: per * C}, (_, i) => Math.floor(i / per)),
                           rowNames: classNames(config)});
    } else {
      opts.labels = +label;
    }
  }
  start(opts).catch((e) => { if (!/cancelled/.test(e.message)) fail(e.message); });
}

/** The model's class names (its numbers where config.json names none). */
function classNames(cfg) {
  const C = cfg.num_classes || 0;
  return cfg.class_names && cfg.class_names.length === C ? cfg.class_names : Array.from({length: C}, (_, i) => String(i));
}

/** The class picker (class-conditional models only): any (unconditional), each class, one row per class
 * (the choice it opens on, with the model's guidance). */
function setupClasses(cfg) {
  const C = cfg.num_classes || 0;
  $("classView").hidden = !C;
  if (!C) return;
  const names = classNames(cfg);
  const options = [["any", "any (unconditional)"], ...names.map((name, i) => [String(i), `${i}: ${name}`]),
                   ["rows", "one row per class"]];
  for (const [value, text] of options) {
    const o = document.createElement("option");
    o.value = value; o.textContent = text;
    $("label").appendChild(o);
  }
  $("guidance").value = cfg.guidance ?? 1;
  const sync = () => { $("guidance").disabled = $("label").value === "any"; };
  $("label").onchange = sync;
  $("label").value = "rows";
  if (query.has("label")) $("label").value = query.get("label");
  if (query.has("guidance")) $("guidance").value = query.get("guidance");
  sync();
}

/** A new mode: stop the running request and take the old grid off the page. */
function switchMode() {
  $("completeView").hidden = mode() !== "complete";
  $("go").textContent = mode() === "complete" ? "complete" : "sample";
  if (pending) { pending.reject(new Error("cancelled by a newer request")); pending = null; worker.postMessage({type: "cancel", id: ++nextId}); }
  clearGrid();
  Object.assign(api, {status: "ready", bytes: null, params: null, row: 0, rows: 0});
  $("stats").textContent = "ready";
}

async function ready(cfg) {
  config = api.config = cfg;
  $("arch").textContent = `${cfg.n_layers} layers, ${cfg.n_heads} heads, d_model ${cfg.d_model}, ${cfg.head} head, ` +
    `${cfg.dataset} ${cfg.height}x${cfg.width}x${cfg.channels}` + (cfg.num_classes ? `, ${cfg.num_classes} classes` : "");
  setupClasses(cfg);
  if (cfg.examples) {
    const buf = new Uint8Array(await (await fetch("examples.bin")).arrayBuffer());
    examples = Array.from({length: cfg.examples}, (_, i) => buf.subarray(i * cfg.length, (i + 1) * cfg.length));
  }
  setupPad();
  for (const key of ["n", "temperature", "seed"]) if (query.has(key)) $(key).value = query.get(key);
  if (query.get("mode") === "complete") document.querySelector("input[value=complete]").checked = true;
  document.querySelectorAll("input[name=mode]").forEach((el) => el.onchange = switchMode);
  $("completeView").hidden = mode() !== "complete";
  $("go").textContent = mode() === "complete" ? "complete" : "sample";
  if (mode() === "complete" && examples && !query.has("label")) pickExample(0);
  else if (mode() === "complete" && examples) padBytes.set(examples[0]), drawPad();
  $("go").onclick = fromControls;
  api.status = "ready";
  $("stats").textContent = "ready";
  if (query.get("autostart") !== "0") fromControls();
}
