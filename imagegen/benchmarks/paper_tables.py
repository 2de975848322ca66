"""The tables of several `imagegen-bench mode=paper` runs in one place, with linear's speed over softmax's.

    python -m imagegen.benchmarks.paper_tables OUT_DIR [OUT_DIR ...] --to docs/paper-tables

reads each OUT_DIR/paper-<data>.json and writes <to>.json (one list of every run's rows, keys as
`mode=paper` writes them: data, attention, train_minutes, steps, test_bits_per_dim, images_per_sec,
batch, whole_image_seconds, cpu, ...), <to>.md (each run's own table, then linear over softmax: images/sec
against the KV-cache sampler and against recomputation, the paper's baseline, and seconds per whole
image) and copies each run's plot beside them as <to>-<data>.png.
"""
import argparse
import json
from pathlib import Path

from ..errors import UserError, one_line
from ..files import write_bytes
from .report import markdown_table


NUMBERS = ("test_bits_per_dim", "images_per_sec", "whole_image_seconds")     # what every row must hold


def load(out_dir):
    """(payload, markdown, png bytes) of the one paper-<data>.json in out_dir."""
    found = sorted(Path(out_dir).glob("paper-*.json"))
    if len(found) != 1:
        raise UserError(f"{out_dir} holds {len(found)} paper-<data>.json files, not one; pass the out_dir of one "
                        f"finished `imagegen-bench mode=paper` run.")
    path = found[0]
    try:
        payload = json.loads(path.read_bytes())
        rows = payload["rows"]
        if not (rows and all(isinstance(r, dict) and {"data", "attention"} <= set(r)
                             and all(isinstance(r.get(k), (int, float)) for k in NUMBERS) for r in rows)):
            raise ValueError("rows without their numbers")
        return payload, path.with_suffix(".md").read_text(errors="replace"), path.with_suffix(".png").read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{path} (or the .md or .png beside it) is unreadable or not what `imagegen-bench mode=paper` "
                        f"writes; run that command again for {out_dir} to write them anew.") from None


def ratios(rows):
    """One row of linear over softmax for a run's rows (None without both attentions)."""
    by = {r["attention"]: r for r in rows}
    if "linear" not in by or "softmax" not in by:
        return None
    lin, soft = by["linear"], by["softmax"]
    out = {"data": lin["data"], "over_kv_cache": lin["images_per_sec"] / soft["images_per_sec"],
           "whole_image": soft["whole_image_seconds"] / lin["whole_image_seconds"]}
    if soft.get("recompute_images_per_sec"):
        out["over_recompute"] = lin["images_per_sec"] / soft["recompute_images_per_sec"]
    out["bits_per_dim"] = lin["test_bits_per_dim"] - soft["test_bits_per_dim"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dirs", nargs="+", help="out_dir of each finished `imagegen-bench mode=paper` run")
    ap.add_argument("--to", required=True, help="path without suffix of the files to write, e.g. docs/paper-tables")
    a = ap.parse_args(argv)
    to = Path(a.to)
    rows, parts, speedups = [], [], []
    for out_dir in a.out_dirs:
        payload, md, png = load(out_dir)
        data = payload["rows"][0]["data"]
        rows += payload["rows"]
        parts.append(f"## {data}\n\n{md.strip()}\n\n![{data}]({to.name}-{data}.png)\n")
        write_bytes(to.parent / f"{to.name}-{data}.png", png, "plot")
        speedups.append(ratios(payload["rows"]))
    table = markdown_table([s for s in speedups if s], [
        ("data", "data", None), ("over_kv_cache", "linear / softmax images/sec (KV cache)", "{:.3g}x"),
        ("over_recompute", "linear / softmax images/sec (recompute)", "{:.4g}x"),
        ("whole_image", "softmax / linear s per whole image (batch 1)", "{:.3g}x"),
        ("bits_per_dim", "linear - softmax test bits/dim", "{:+.4f}")])
    md = ("# The paper's comparison, trained here\n\n"
          f"Written by `python -m imagegen.benchmarks.paper_tables {' '.join(a.out_dirs)} --to {a.to}` from the "
          f"runs below (each run's command and machine in its header; docs/paper.md).\n\n## Linear over softmax\n\n"
          f"{table}\n\n" + "\n".join(parts))
    write_bytes(to.with_suffix(".json"), (json.dumps(rows, indent=1) + "\n").encode(), "table")
    write_bytes(to.with_suffix(".md"), md.encode(), "table")
    print(md)


if __name__ == "__main__":
    one_line(main)()
