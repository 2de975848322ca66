"""imagegen-run pack | unpack: a run folder as a few size-capped, checksummed files, and back on another machine,
where imagegen-train resumes it (Hydra apps; see conf/pack.yaml, conf/unpack.yaml, imagegen/training/travel.py
and docs/runs.md)."""
import sys

from .cli import hydra_entry
from ..config import PackConfig, UnpackConfig, typed


def pack(cfg, device):
    from ..training.travel import pack_run
    cfg = typed(PackConfig, cfg)
    pack_run(cfg.run_dir, cfg.out, cfg.state, cfg.best, cfg.max_files, cfg.max_file_mib, cfg.overwrite)


def unpack(cfg, device):
    from ..training.travel import unpack_run
    cfg = typed(UnpackConfig, cfg)
    unpack_run(cfg.pack, cfg.run_dir, cfg.overwrite)


VERBS = {"pack": hydra_entry("pack", pack), "unpack": hydra_entry("unpack", unpack)}


def main():
    """imagegen-run VERB [key=value ...]: VERB is pack or unpack."""
    args = sys.argv[1:]
    if not args or args[0] not in VERBS:
        got = f" (got {args[0]!r})" if args else ""
        sys.exit(f"error: imagegen-run needs a verb{got}: imagegen-run pack run_dir=RUN out=PACK, or imagegen-run "
                 f"unpack pack=PACK run_dir=NEW; see imagegen-run pack --help.")
    sys.argv = [sys.argv[0]] + args[1:]
    VERBS[args[0]]()


if __name__ == "__main__":
    main()
