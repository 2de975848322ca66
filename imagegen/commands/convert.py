"""imagegen-convert: a run's checkpoint as a shippable model, OUT.safetensors + OUT.json (Hydra app;
see conf/convert.yaml and imagegen/store/shipped.py; OUT.json records the sha256 of OUT.safetensors, which
every load checks). The result loads wherever a checkpoint is taken
(checkpoint=OUT.safetensors), and by name once it lies in the package's checkpoints/ folder.
precision=int8 stores each Dense layer's weight in 8 bits with a float32 scale per output column (about a
quarter of the size); it loads as float32 (q * scale), and the check scores those weights. On the CPU the
check scores the same images with int8 products too, as sampling runs them (`ops.dense.int8_weights`: the
products the model keeps out of int8 stay float32 or bfloat16, `ops.dense.int8_keeps`), which is int8_check:
what sampling's precision=auto weighs. Both are the Python API's figures (api.from_checkpoint of the weights as
written, Model.bits_per_dim at float32 and at int8, Model.scoring_plan's int8_product).

Nothing is written until everything that can fail has run (the check scores the bytes the
.safetensors file will hold): a failed or interrupted convert leaves no OUT files behind."""
import json
from pathlib import Path

from ..api import from_checkpoint
from ..store import checkpoint, checks, shipped
from ..store.format import FORMAT
from .cli import hydra_entry
from ..config import ConvertConfig, check_sampling, plain, typed
from ..errors import UserError
from ..say import show


def convert(cfg, device):
    """Write the files; returns the record stored in OUT.json. The .json keeps the checkpoint's data
    section (its root included, made absolute; keep_root=false: empty), with the non-null data.* values
    of the command line over it. A shipped model (OUT.safetensors of an earlier convert) keeps its record,
    with this command's guidance, precision and checks over it."""
    cfg = typed(ConvertConfig, cfg)
    if cfg.check_images < 0:
        raise UserError(f"check_images must be >= 0 (0: skip the check), got {cfg.check_images}.")
    check_sampling(guidance=cfg.guidance)          # the default every later sample takes
    precision = shipped.check_precision(cfg.precision)
    shipped.check_writable(cfg.out, cfg.overwrite)     # before the check's minutes, not after
    path = shipped.resolve(cfg.checkpoint)
    ck = checkpoint.load(path)
    model = from_checkpoint(ck, path).module
    state = ck.get("state", {})
    if "record" in ck:            # a shipped model converted again (another precision, a new check): its record kept
        record = dict(ck["record"])
    else:                         # source: the run's folder and file, not this machine's path (the record ships)
        record = {"source": shipped.run_file(path), "step": state.get("step"),
                  "minutes": round(state.get("elapsed", 0) / 60, 1),
                  "val_bits_per_dim": state.get("best_val"), "averaged_weights": "ema" in ck,
                  "n_params": sum(p.numel() for p in model.parameters())}
    record.update(guidance=cfg.guidance, precision=precision)
    data = {**ck["config"]["data"], **{k: v for k, v in plain(cfg.data).items() if v is not None}}
    if data.get("root") is not None:
        data["root"] = str(Path(data["root"]).expanduser().absolute())
    config = json.loads(json.dumps(shipped.shippable_config(ck["config"], data)))     # as OUT.json will hold it
    blob = shipped.weights_bytes(shipped.int8_state(model) if precision == "int8" else model.state_dict())
    if cfg.check_images:
        from safetensors.torch import load as load_weights

        # score the bytes as they will be written (int8: as they load, q * scale), not the model in memory
        weights = shipped.dequantized(load_weights(blob), path)
        converted = checks.check({"format": FORMAT, "config": config, "model": weights}, path)
        again = from_checkpoint(converted, path, device)
        x, y = again.load_split("test", n=cfg.check_images)
        conditional = bool(again.module.num_classes)
        score = dict(labels=y if conditional else None, batch_size=cfg.batch_size, progress=cfg.progress)
        bpd = again.bits_per_dim(x, **score)
        record["test_check"] = {"images": len(x), "bits_per_dim": bpd, "labels": conditional}
        show(f"bits/dim of the first {len(x)} test images: {bpd:.4f} (recorded)")
        if again.why_not_int8() is None:          # what sampling's precision=auto weighs (precision.int8_cost)
            plan = again.scoring_plan("int8")
            int8 = again.bits_per_dim(x, plan=plan, **score)
            record["int8_check"] = {"images": len(x), "float32": bpd, "int8": int8, "product": plan.int8_product}
            show(f"with int8 products: {int8:.4f} ({int8 - bpd:+.4f}, recorded)")
    if not cfg.keep_root:
        config["data"]["root"] = None           # a model to ship: the loading machine's data/<name>
    weights, meta = shipped.write(cfg.out, config, blob, record, cfg.overwrite)
    show(f"wrote {weights} and {meta}")
    return record


main = hydra_entry("convert", convert)

if __name__ == "__main__":
    main()
