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


def outputs(out_dir, name):
    """The two files write_outputs writes: out_dir/name.json and .md."""
    return [Path(out_dir) / f"{name}{suffix}" for suffix in (".json", ".md")]


def write_outputs(out_dir, name, payload, markdown, quiet=False):
    """out_dir/name.json and .md, each through files.write_owned (a temporary file and a rename: a run stopped
    while writing leaves the previous rows; recorded as imagegen's, so that the next run replaces them without
    asking; imagegen-bench refuses a user's file there before it measures, `check_outputs`); quiet: without
    printing the table."""
    from ..files import write_owned

    json_path, md_path = outputs(out_dir, name)
    for path, text in ((json_path, json.dumps(payload, indent=2) + "\n"), (md_path, markdown + "\n")):
        write_owned(path, text.encode(), "table", overwrite=True)
    if not quiet:
        print(markdown)
        print(f"\nwrote {json_path} and {md_path}")
