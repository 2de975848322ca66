"""The paper's table for trained checkpoints: attention (with the linear attention's feature map and
gate), parameters, test bits/dim, training ms/step (the run's own clock: elapsed / steps, as saved),
images/sec.

Every row's bits/dim is over the same images: an evaluation JSON beside a checkpoint is reused
only when it was written for that very checkpoint (modification time and step), on the same
split and with the same max_images; rows over different image counts are refused."""
import json

from ..config import BenchConfig, typed
from ..store import checkpoint, shipped
from ..data.sets import dataset_info
from ..errors import UserError
from ..sampling.decode import resolve_sampler, sampler_label
from .report import machine, markdown_table
from .sampling import measure, timed_positions


def attention_label(model_cfg):
    """The attention of a model config as the table names it: softmax, lsh, linear elu, linear favor:64 gate=input."""
    if model_cfg["attention"] != "linear":
        return model_cfg["attention"]
    options = model_cfg.get("attention_options") or {}
    label = f"linear {options.get('feature_map', 'elu')}"
    if options.get("n_features") is not None:
        label += f":{options['n_features']}"
    if options.get("gate", "none") != "none":
        label += f" gate={options['gate']}"
    return label


def train_step_ms(state):
    """Milliseconds per training step from a checkpoint's run state (elapsed / step), None when it has none."""
    step, elapsed = state.get("step"), state.get("elapsed")
    return 1000 * elapsed / step if isinstance(step, int) and step > 0 and isinstance(elapsed, (int, float)) else None


def current_eval(path, ck, split, max_images):
    """The result in <stem>.<split>.json when imagegen-eval wrote it for this checkpoint file (same
    mtime and step) on this split with this max_images (None: the whole split); else None."""
    js = checkpoint.eval_json(path, split)
    if not js.exists():
        return None
    try:
        result = json.loads(js.read_bytes())
    except (OSError, ValueError):                   # unreadable (not UTF-8, not JSON): evaluated again
        return None
    if not isinstance(result, dict):
        return None
    same = {"split": split, "max_images": max_images or None, "checkpoint_mtime": path.stat().st_mtime,
            "checkpoint_step": ck.get("state", {}).get("step")}
    # "max_images" is absent from JSONs written before it was recorded: those are not reused
    if any(k not in result or result[k] != v for k, v in same.items()) or "images" not in result:
        return None
    return result


def run(cfg, evaluate):
    """evaluate(path) -> the result dict of imagegen-eval (bits_per_dim, images), called when no
    current evaluation JSON exists. cfg: a BenchConfig (or a dict of one); its options: cfg.compare, its timing
    cfg.sampling's."""
    cfg = typed(BenchConfig, cfg)
    split, timing = cfg.compare.split, cfg.sampling
    if not cfg.compare.checkpoints:
        raise UserError("mode=compare needs compare.checkpoints=[a.pt,b.pt,...].")
    rows, models = [], []
    for p in cfg.compare.checkpoints:           # bits/dim first: a mismatch stops before the timing
        path = shipped.resolve(p)
        ck = checkpoint.load(path, hint="compare.checkpoints=[a.pt,b.pt,...]")
        result, source = current_eval(path, ck, split, cfg.max_images), "json"
        if result is None:
            result, source = evaluate(path), "computed"
        models.append((path, ck))
        state = ck.get("state") or {}
        rows.append({"checkpoint": str(path), "attention": attention_label(ck["config"]["model"]),
                     "bits_per_dim": result["bits_per_dim"], "images": result["images"], "bpd_source": source,
                     "train_step_ms": train_step_ms(state)})
    counts = {r["images"] for r in rows}
    if len(counts) > 1:
        found = ", ".join(f"{r['checkpoint']}: {r['images']}" for r in rows)
        raise UserError(f"the {split} bits/dim would be over different image counts ({found}); pass "
                        f"the same data to every checkpoint (eval_data.root) or bound them all with max_images=N.")
    for row, (path, ck) in zip(rows, models):
        model = checkpoint.model_from_checkpoint(ck, path).eval()
        info = dataset_info(ck["config"]["data"])
        sampler = resolve_sampler(model, "auto")
        positions = timed_positions(info.length, timing.n_positions)
        batches = timing.step_batches if sampler == "step" else timing.recompute_batches
        speeds = {b: b / measure(model, sampler, b, positions, timing.reps)[0] for b in batches}
        batch = max(speeds, key=speeds.get)
        row.update({"parameters": sum(t.numel() for t in model.parameters()),
                    "sampler": sampler_label(model, sampler), "batch": batch, "images_per_sec": speeds[batch]})
        print(f"{path}: {row['bits_per_dim']:.4f} bits/dim over {row['images']} {split} images "
              f"({row['bpd_source']}), {speeds[batch]:.4g} images/s", flush=True)
    slowest = min(r["images_per_sec"] for r in rows)
    for r in rows:
        r["speedup"] = r["images_per_sec"] / slowest
    cols = [("checkpoint", "checkpoint", None), ("attention", "attention", None), ("parameters", "params", "{:,}"),
            ("bits_per_dim", f"{split} bits/dim", "{:.4f}"), ("images", f"{split} images", "{:,}"),
            ("train_step_ms", "train ms/step", "{:.1f}"),
            ("sampler", "sampler", None), ("batch", "batch", None), ("images_per_sec", "images/sec", "{:.4g}"),
            ("speedup", "speedup", "{:.1f}x")]
    md = f"Machine: {machine()}.\n\n" + markdown_table(rows, cols)
    return {"rows": rows}, md
