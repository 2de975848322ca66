"""Figures drawn with matplotlib on its Agg canvas (PNG files, no display): line charts, the
training curves of runs read from their metrics.jsonl."""
import io
import json
import os
from pathlib import Path

import numpy as np

from . import files
from .errors import UserError
from .say import show


def figure(ncols=1, width=7.2, height=4.2):
    """A matplotlib Figure with ncols side-by-side axes on an Agg canvas (pyplot's global state and
    any display backend are never touched)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    for ax in axes:
        ax.grid(True, which="major", alpha=0.3)
    return fig, list(axes)


def log_y(ax):
    """Log-scale y axis labelled with plain numbers (2, 3, 5 rather than 2x10^0)."""
    from matplotlib.ticker import FormatStrFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))


def encode(fig, path):
    """The figure's bytes in the format path's suffix names (.png, .svg, .pdf, ...), 100 dpi; a UserError
    sentence for a suffix matplotlib does not write."""
    fmt = Path(path).suffix[1:].lower()
    if fmt not in fig.canvas.get_supported_filetypes():
        named = f"ends in .{fmt}, which names no format matplotlib writes" if fmt else "has no suffix"
        raise UserError(f"{path} {named}; end it in .png, .svg or .pdf (nothing was written).")
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=100)
    return buf.getvalue()


def save(fig, path, overwrite=None):
    """Write the figure (atomically, creating the folder) and say so. overwrite=None: a benchmark's own
    output folder, replaced freely as its tables are; True/False: a path the user chose, under
    files.write_owned's rule (a file imagegen did not write there is replaced only with overwrite)."""
    data = encode(fig, path)
    if overwrite is None:               # a benchmark's: its own, recorded (imagegen-bench checked before measuring)
        files.write_owned(path, data, "plot", True)
    else:
        files.write_owned(path, data, "plot", overwrite)
    show(f"wrote {path}")
    return Path(path)


def line_chart(path, series, title, xlabel, ylabel, log=False):
    """series: {label: (xs, ys)} drawn as lines with markers; log=True puts the y axis on a log scale."""
    fig, (ax,) = figure()
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel, xlim=(0, None))
    if log:
        log_y(ax)
    else:
        ax.set_ylim(bottom=0)
    ax.legend(frameon=True)
    return save(fig, path)


def read_metrics(run_dir):
    """The rows of run_dir/metrics.jsonl (or the file itself when given one), as dicts in file order.
    A final line cut short by a crash mid-write is dropped."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file() or path.stat().st_size == 0:
        raise UserError(f"no metrics in {path} (missing or empty); pass run folders written by imagegen-train "
                        f"that have logged at least one step.")
    text = path.read_bytes().decode("utf-8", errors="replace")    # bytes that are not UTF-8: a line not JSON
    lines = text.splitlines()
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) and not text.endswith("\n"):
                break                               # the last row, cut short mid-write
            raise UserError(f"{path} line {i} is not JSON; remove that line or the file.") from None
        if isinstance(row, dict):
            rows.append(row)
    return rows


def curve(rows, key):
    """(steps, values, minutes) of the rows holding a number under `key`, one point per step (the last
    row written for a step wins, as a resumed run re-logs the steps after its checkpoint), sorted by step.
    minutes come from each row's "elapsed" (seconds of training) or, where a row has none (validation
    rows), are interpolated from the training rows' elapsed at that step; None when no row has it."""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    points = {r["step"]: r for r in rows if number(r.get(key)) and number(r.get("step"))}
    steps = sorted(points)
    values = [points[s][key] for s in steps]
    clock = {r["step"]: r["elapsed"] for r in rows if number(r.get("elapsed")) and number(r.get("step"))}
    if not clock:
        return steps, values, None
    known = sorted(clock)
    minutes = [(points[s]["elapsed"] if number(points[s].get("elapsed"))
                else float(np.interp(s, [0] + known, [0.0] + [clock[k] for k in known]))) / 60 for s in steps]
    return steps, values, minutes


def run_labels(run_dirs):
    """Each run's folder name, or its whole path where two runs share a name."""
    names = [Path(d).name or str(d) for d in run_dirs]
    return [n if names.count(n) == 1 else str(d) for n, d in zip(names, run_dirs)]


def training_curves(run_dirs, out, log=False, overwrite=False):
    """One PNG with two panels, bits/dim against steps and against minutes of training: each run's
    training bits/dim (thin line) and validation bits/dim (markers) in one colour per run."""
    if not run_dirs:
        raise UserError("no runs to plot; pass runs=[DIR,...] with the run folders of imagegen-train.")
    fig, (by_step, by_minute) = figure(ncols=2)
    colours = [f"C{i}" for i in range(10)]
    drawn_minutes = False
    for i, (run_dir, label) in enumerate(zip(run_dirs, run_labels(run_dirs))):
        rows = read_metrics(run_dir)
        train, val = curve(rows, "bpd"), curve(rows, "val_bpd")
        if not train[0] and not val[0]:
            raise UserError(f"{run_dir} logged no bits/dim yet (no rows with bpd or val_bpd); train it longer "
                            f"or leave it out of runs.")
        c = colours[i % len(colours)]
        for (steps, values, minutes), style, name in ((train, dict(lw=1.2), "train"),
                                                      (val, dict(lw=1, ls="--", marker="o", ms=4), "val")):
            if not steps:
                continue
            by_step.plot(steps, values, color=c, label=f"{label} {name}", **style)
            if minutes is not None:
                by_minute.plot(minutes, values, color=c, label=f"{label} {name}", **style)
                drawn_minutes = True
        last = f"train {train[1][-1]:.4f} at step {train[0][-1]}" if train[0] else "no train rows"
        best = f"best val {min(val[1]):.4f}" if val[0] else "no validation rows"
        show(f"{label}: {last}, {best}")
    by_step.set(title="bits/dim against steps", xlabel="step", ylabel="bits/dim")
    by_minute.set(title="bits/dim against minutes of training", xlabel="minutes", ylabel="bits/dim")
    if not drawn_minutes:
        by_minute.text(0.5, 0.5, "no elapsed times in these metrics", ha="center", transform=by_minute.transAxes)
    for ax in (by_step, by_minute):
        if log:
            log_y(ax)
        if ax.lines:
            ax.legend(frameon=True, fontsize="small")
    return save(fig, out, overwrite)


def default_out(run_dirs, name="curves.png"):
    """curves.png in the runs' common folder (e.g. checkpoints/ for checkpoints/a and checkpoints/b)."""
    return Path(os.path.commonpath([str(Path(d).resolve()) for d in run_dirs])) / name
