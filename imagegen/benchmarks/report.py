"""Benchmark output: markdown tables and JSON (plots: imagegen/plots.py)."""
import json
from pathlib import Path

import torch

from ..tuning.machine import cpu_name


def machine():
    """A one-line description of where a benchmark ran."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{cpu_name()}, {torch.get_num_threads()} torch threads, {gpu}, torch {torch.__version__}"


def markdown_table(rows, columns):
    """rows: list of dicts; columns: list of (key, header, format)."""
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for key, _, fmt in columns:
            value = row.get(key)
            cells.append("-" if value is None else (fmt.format(value) if fmt else str(value)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_outputs(out_dir, name, payload, markdown, quiet=False):
    """out_dir/name.json and .md, each through a temporary file and a rename (a run stopped while
    writing leaves the previous rows); quiet: without printing the table."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".json", json.dumps(payload, indent=2) + "\n"), (".md", markdown + "\n")):
        tmp = out / f".{name}{suffix}.tmp"
        tmp.write_text(text)
        tmp.replace(out / f"{name}{suffix}")
    if not quiet:
        print(markdown)
        print(f"\nwrote {out / (name + '.json')} and {out / (name + '.md')}")
