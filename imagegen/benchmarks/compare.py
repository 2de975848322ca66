"""The paper's table for trained checkpoints: attention, parameters, test bits/dim, images/sec."""
import json
from pathlib import Path

from .. import checkpoint
from ..data import dataset_info
from ..errors import UserError
from ..sampling import resolve_sampler, sampler_label
from .report import machine, markdown_table
from .sampling import measure, timed_positions


def current_eval(path, split):
    """The bits/dim in <stem>.<split>.json when it was written for this very checkpoint file."""
    js = path.with_name(f"{path.stem}.{split}.json")
    if not js.exists():
        return None
    result = json.loads(js.read_text())
    if result.get("checkpoint_mtime") != path.stat().st_mtime or result.get("split") != split:
        return None
    return result["bits_per_dim"]


def run(cfg, evaluate):
    """evaluate(path) -> bits/dim, called when no current evaluation JSON exists."""
    rows = []
    for p in cfg["checkpoints"]:
        path = Path(p)
        ck = checkpoint.load(path)
        model = checkpoint.model_from_checkpoint(ck, path).eval()
        info = dataset_info(ck["config"]["data"]["name"])
        bpd = current_eval(path, cfg["split"])
        source = "json"
        if bpd is None:
            bpd, source = evaluate(path), "computed"
        sampler = resolve_sampler(model, "auto")
        positions = timed_positions(info.length, cfg["n_positions"])
        batches = cfg["step_batches"] if sampler == "step" else cfg["recompute_batches"]
        speeds = {b: b / measure(model, sampler, b, positions, cfg["reps"])[0] for b in batches}
        batch = max(speeds, key=speeds.get)
        rows.append({"checkpoint": str(path), "attention": ck["config"]["model"]["attention"],
                     "parameters": sum(t.numel() for t in model.parameters()), "bits_per_dim": bpd,
                     "bpd_source": source, "sampler": sampler_label(model, sampler), "batch": batch,
                     "images_per_sec": speeds[batch]})
        print(f"{path}: {bpd:.4f} bits/dim, {speeds[batch]:.4g} images/s", flush=True)
    if not rows:
        raise UserError("mode=compare needs checkpoints=[a.pt,b.pt,...].")
    slowest = min(r["images_per_sec"] for r in rows)
    for r in rows:
        r["speedup"] = r["images_per_sec"] / slowest
    cols = [("checkpoint", "checkpoint", None), ("attention", "attention", None), ("parameters", "params", "{:,}"),
            ("bits_per_dim", f"{cfg['split']} bits/dim", "{:.4f}"), ("sampler", "sampler", None),
            ("batch", "batch", None), ("images_per_sec", "images/sec", "{:.4g}"), ("speedup", "speedup", "{:.1f}x")]
    md = f"Machine: {machine()}.\n\n" + markdown_table(rows, cols)
    return {"rows": rows}, md
