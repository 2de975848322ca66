"""imagegen-eval: exact bits/dim of a checkpoint on a split (Hydra app; see conf/eval.yaml), a thin layer
over the Python API (imagegen.api: load, Model.load_split, scoring_plan, bits_per_dim) with its defaults.

precision=bfloat16 runs the forward under bfloat16 autocast (products in bfloat16, LayerNorm,
the attention's sums and the head's log-likelihood in float32); precision=int8 (CPU) runs every
Dense layer with 8-bit weights, activations quantized per row (the product the sampler runs), so the
result is the exact bits/dim of that quantized model; the NLL is summed in float64 either way."""
import json
import time

from ..api import load
from ..store import checkpoint, shipped
from ..training import distributed
from .cli import hydra_entry
from ..config import EvalConfig, check_eval, typed
from ..files import check_owned, write_owned
from ..say import show


def evaluate(cfg, device):
    """Returns the result dict; also writes it to <checkpoint stem>.<split>.json beside the checkpoint.
    Under torchrun each rank scores its share of the images and rank 0 writes."""
    world, device = distributed.setup(device)
    try:
        return evaluate_on(cfg, device, world)
    finally:
        distributed.teardown(world)


def evaluate_on(cfg, device, world):
    """imagegen-eval on one rank of `world`: Model.bits_per_dim (imagegen.api) of the split's images."""
    cfg = typed(EvalConfig, cfg)
    check_eval(cfg)
    path = shipped.resolve(cfg.checkpoint)
    out = checkpoint.eval_json(path, cfg.split)
    if world.main:                         # a user's file there: refused before the minutes of scoring
        check_owned([out], "result", cfg.overwrite)
    model = load(path, device, threads=None)     # threads: the command fitted them (cli.resolve_device)
    data = cfg.data
    images, classes = model.load_split(cfg.split, cfg.max_images or None, data.root, data.download, data.mirror)
    conditional = bool(model.class_names)
    labels = classes if conditional and cfg.labels else None
    draws = model.scoring_draws(cfg.lsh_draws)
    plan = model.scoring_plan(cfg.precision)    # auto: measured
    if world.main and plan.note:
        show(plan.note)
    start = time.perf_counter()
    bpd = model.bits_per_dim(images, labels, cfg.batch_size, lsh_draws=draws, lsh_seed=cfg.lsh_seed,
                             progress=cfg.progress and world.main, world=world, plan=plan, quiet=True)
    result = {"bits_per_dim": bpd, "split": cfg.split, "images": len(images),
              "max_images": cfg.max_images or None, "dims": model.info.length,
              "attention": model.config["model"]["attention"], "lsh_draws": draws, "precision": plan.precision,
              "labels": None if not conditional else labels is not None, "checkpoint": str(path),
              "checkpoint_step": model.step, "checkpoint_mtime": path.stat().st_mtime,
              "seconds": time.perf_counter() - start}
    if not world.main:
        return result
    write_owned(out, (json.dumps(result, indent=2) + "\n").encode(), "result", cfg.overwrite)
    given = "" if not conditional else (", each given its label" if labels is not None else ", without labels")
    show(f"{len(images)} {cfg.split} images{given}, {draws} draw(s), {plan.precision}, {result['seconds']:.1f} s; "
         f"wrote {out}")
    show(f"bits/dim: {bpd:.4f}")
    return result


main = hydra_entry("eval", evaluate)

if __name__ == "__main__":
    main()
