"""imagegen-eval: exact bits/dim of a checkpoint on a split (Hydra app; see conf/eval.yaml).

precision=bfloat16 runs the forward under bfloat16 autocast (products in bfloat16, LayerNorm,
the attention's sums and the head's log-likelihood in float32); precision=int8 (CPU) runs every
Dense layer with 8-bit weights, activations quantized per row (`ops.dense.int8_weights`: the product the
sampler runs), so the result is the exact bits/dim of that quantized model; the NLL is summed in float64 either way."""
import json
import time

import torch

from ..store import checkpoint, shipped
from ..training import distributed
from .cli import hydra_entry
from ..config import check_eval
from ..data.sets import load_from_config
from ..files import check_owned, write_owned
from ..say import show
from ..dtypes import autocast, dtype_name
from ..model.transformer import model_dims
from ..precision import decide_precision, slow_bf16_note
from ..bits_per_dim import LN2, total_nll
from ..sampling.decode import int8_forward


def evaluate(cfg, device):
    """Returns the result dict; also writes it to <checkpoint stem>.<split>.json beside the checkpoint.
    Under torchrun each rank scores its share of the images and rank 0 writes."""
    world, device = distributed.setup(device)
    try:
        return evaluate_on(cfg, device, world)
    finally:
        distributed.teardown(world)


def evaluate_on(cfg, device, world):
    check_eval(cfg)
    path = shipped.resolve(cfg["checkpoint"])
    out = checkpoint.eval_json(path, cfg["split"])
    if world.main:                         # a user's file there: refused before the minutes of scoring
        check_owned([out], "result", cfg.get("overwrite", False))
    ck = checkpoint.load(path)
    model = checkpoint.model_from_checkpoint(ck, path).to(device)
    ((x, y),) = load_from_config(ck["config"]["data"], (cfg["split"],), cfg["data"], labels=True)
    if cfg["max_images"]:
        x, y = x[: cfg["max_images"]], y[: cfg["max_images"]]
    labels = y if model.num_classes and cfg.get("labels", True) else None
    lsh = [b.attn for b in model.blocks if b.attn.name == "lsh"]
    draws = cfg["lsh_draws"] if lsh else 1
    dtype = decide_precision(cfg.get("precision", "float32"), device, dims=model_dims(model)).value  # auto: measured
    if world.main and (note := slow_bf16_note(dtype, device)):
        show(note)
    start = time.perf_counter()
    nats = []
    for draw in range(draws):   # LSH: average the NLL over seeded hash draws
        for attn in lsh:
            attn.eval_seed = cfg["lsh_seed"] + draw
        with autocast(device, dtype == torch.bfloat16), int8_forward(model, dtype):
            nats.append(total_nll(model, x, cfg["batch_size"], device, progress=cfg["progress"] and world.main,
                                  desc=f"{cfg['split']} draw {draw + 1}/{draws}" if lsh else cfg["split"],
                                  world=world, labels=labels))
    bpd = sum(nats) / len(nats) / (x.numel() * LN2)
    result = {"bits_per_dim": bpd, "split": cfg["split"], "images": len(x), "max_images": cfg["max_images"] or None,
              "dims": x.shape[1], "attention": ck["config"]["model"]["attention"], "lsh_draws": draws,
              "precision": dtype_name(dtype), "labels": None if not model.num_classes else labels is not None,
              "checkpoint": str(path), "checkpoint_step": ck.get("state", {}).get("step"),
              "checkpoint_mtime": path.stat().st_mtime, "seconds": time.perf_counter() - start}
    if not world.main:
        return result
    write_owned(out, (json.dumps(result, indent=2) + "\n").encode(), "result", cfg.get("overwrite", False))
    given = "" if not model.num_classes else (", each given its label" if labels is not None else ", without labels")
    show(f"{len(x)} {cfg['split']} images{given}, {draws} draw(s), {dtype_name(dtype)}, {result['seconds']:.1f} s; "
          f"wrote {out}")
    show(f"bits/dim: {bpd:.4f}")
    return result


main = hydra_entry("eval", evaluate)

if __name__ == "__main__":
    main()
