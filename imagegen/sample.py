"""imagegen-sample: image grids and completions from a checkpoint (Hydra app; see conf/sample.yaml)."""
import time
from pathlib import Path

from . import checkpoint
from .cli import hydra_entry
from .config import check_sample
from .data import dataset_info, load_from_config
from .files import write_image
from .memory import check_request_fits
from .precision import dtype_name, resolve_precision, slow_bf16_note
from .sampling import completion_rows, generate, grid, resolve_sampler, sampler_label, to_images


def run_sample(cfg, device):
    check_sample(cfg)
    path = Path(cfg["checkpoint"])
    ck = checkpoint.load(path)
    model = checkpoint.model_from_checkpoint(ck, path).to(device).eval()
    info = dataset_info(ck["config"]["data"]["name"])
    check_request_fits(cfg, info)
    sampler = resolve_sampler(model, cfg["sampler"])
    label = sampler_label(model, sampler)
    dtype = resolve_precision(cfg["precision"], device)
    if note := slow_bf16_note(dtype, device):
        print(note)
    common = dict(sampler=sampler, temperature=cfg["temperature"], seed=cfg["seed"], batch_size=cfg["batch_size"],
                  progress=cfg["progress"], dtype=dtype)
    out = Path(cfg["out"] or path.with_name(f"{path.stem}-{cfg['mode']}.png"))   # default: beside the checkpoint
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if cfg["mode"] == "grid":
        seqs = generate(model, cfg["num_images"], desc=f"{label} sampling", **common)
        images = to_images(seqs, info)
        nrow = cfg["nrow"]
    else:                                    # mode=complete (check_sample allows no other)
        (originals,) = load_from_config(ck["config"]["data"], ("test",), cfg["data"])
        originals = originals[: cfg["num_originals"]]
        k = cfg["completions"]
        keep = info.height // 2
        prefix = originals[:, : keep * info.width * info.channels].repeat_interleave(k, dim=0)
        seqs = generate(model, len(prefix), prefix=prefix, desc=f"{label} completing", **common)
        completions = to_images(seqs, info).reshape(len(originals), k, info.height, info.width, info.channels)
        images = completion_rows(to_images(originals, info), completions, keep)
        nrow = k + 2
    seconds = time.perf_counter() - start
    write_image(out, grid(images, nrow=nrow, scale=cfg["scale"]), "sample grid")
    if cfg["save_each"]:
        folder = out.with_suffix("")
        folder.mkdir(exist_ok=True)
        for i, img in enumerate(to_images(seqs, info)):
            write_image(folder / f"{i:04d}.png", grid(img[None], nrow=1, scale=cfg["scale"], pad=0), "sample")
    print(f"wrote {out} ({len(images)} tiles, {nrow} per row)")
    print(f"{len(seqs)} images in {seconds:.1f} s with the {label} sampler, batch {cfg['batch_size']}, "
          f"{dtype_name(dtype)} (precision={cfg['precision']}): {len(seqs) / seconds:.2f} images/sec")


main = hydra_entry("sample", run_sample,
                   description='sample an image grid, or completions of test images, from a checkpoint.',
                   examples=["imagegen-sample checkpoint=checkpoints/mnist-linear-small/best.pt num_images=64",
                             "imagegen-sample checkpoint=run/best.pt mode=complete out=complete.png"])

if __name__ == "__main__":
    main()
