"""Benchmark output: markdown tables, JSON, and a small line plot drawn with Pillow."""
import json
import platform
from pathlib import Path

import torch
from PIL import Image, ImageDraw


def machine():
    """A one-line description of where a benchmark ran."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {torch.get_num_threads()} torch threads, {gpu}, torch {torch.__version__}"


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


def write_outputs(out_dir, name, payload, markdown):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown + "\n")
    print(markdown)
    print(f"\nwrote {out / (name + '.json')} and {out / (name + '.md')}")


COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14)]


def line_plot(path, series, title, xlabel, ylabel, size=(720, 420)):
    """series: {label: (xs, ys)} drawn as lines on linear axes starting at 0."""
    W, H = size
    left, right, top, bottom = 70, 20, 40, 50
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    xmax = max(max(xs) for xs, _ in series.values()) or 1
    ymax = max(max(ys) for _, ys in series.values()) * 1.1 or 1
    sx = lambda x: left + (W - left - right) * x / xmax
    sy = lambda y: H - bottom - (H - top - bottom) * y / ymax
    d.rectangle([left, top, W - right, H - bottom], outline="black")
    for i in range(6):
        x, y = xmax * i / 5, ymax * i / 5
        d.text((sx(x) - 10, H - bottom + 5), f"{x:.0f}", fill="black")
        d.text((5, sy(y) - 6), f"{y:.3g}", fill="black")
        d.line([left, sy(y), W - right, sy(y)], fill=(230, 230, 230))
    for i, (label, (xs, ys)) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        d.line([(sx(x), sy(y)) for x, y in zip(xs, ys)], fill=colour, width=2)
        for x, y in zip(xs, ys):
            d.ellipse([sx(x) - 3, sy(y) - 3, sx(x) + 3, sy(y) + 3], fill=colour)
        d.text((left + 10, top + 8 + 14 * i), label, fill=colour)
    d.text((left, 12), title, fill="black")
    d.text(((W - len(xlabel) * 6) / 2, H - 20), xlabel, fill="black")
    d.text((left + 10, top - 14), ylabel, fill="black")
    img.save(path)
