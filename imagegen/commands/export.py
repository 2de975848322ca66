"""imagegen-export: a linear-attention checkpoint as a static web page that samples it as an RNN
in JavaScript (Hydra app; see conf/export.yaml; the site's files: imagegen/web/site.py)."""
from ..config import ExportConfig, check_sampling, plain, typed
from ..data.sets import load_from_config
from ..errors import UserError
from ..say import show
from ..store import checkpoint, shipped
from ..web.site import page_config, write_site
from .cli import hydra_entry


def test_images(ck, count, overrides):
    """Up to `count` test images (n, D) uint8 for the completion mode and their labels (n,), or None
    with a note if unavailable."""
    if count <= 0:
        return None
    try:
        ((images, labels),) = load_from_config(ck["config"]["data"], ("test",), overrides, labels=True)
    except UserError as e:
        show(f"note: no test images included for the completion mode ({e}); drawing still works.")
        return None
    return images[:count], labels[:count]


def export(cfg):
    """Write the site for cfg.checkpoint into cfg.out; returns {file name: bytes written}.
    precision=int8 (or null for a model converted at int8) writes int8 Dense weights with their scales."""
    cfg = typed(ExportConfig, cfg)
    if cfg.precision is not None:
        shipped.check_precision(cfg.precision)
    path = shipped.resolve(cfg.checkpoint)
    ck = checkpoint.load(path)
    model = checkpoint.model_from_checkpoint(ck, path)
    guidance = float(ck.get("record", {}).get("guidance", 1.0) if cfg.guidance is None else cfg.guidance)
    check_sampling(guidance=guidance)
    precision = cfg.precision or ("int8" if ck.get("record", {}).get("precision") == "int8" else "float32")
    page_config(model, ck["config"]["data"])          # refuse what the page cannot run before reading data
    examples = test_images(ck, cfg.examples, plain(cfg.data))
    return write_site(model, ck["config"]["data"], cfg.out, examples, guidance, cfg.overwrite,
                      precision)


def run_export(cfg, device):
    cfg = typed(ExportConfig, cfg)
    sizes = export(cfg)
    show(f"wrote {len(sizes)} files ({sum(sizes.values()) / 2 ** 20:.1f} MiB) to {cfg.out}; serve it with "
          f"`python -m http.server -d {cfg.out} 8000` and open http://127.0.0.1:8000/")


main = hydra_entry("export", run_export)

if __name__ == "__main__":
    main()
