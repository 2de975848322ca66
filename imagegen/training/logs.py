"""Where a run's metrics go: run_dir/metrics.jsonl (always), TensorBoard event files in run_dir
(optional, so `tensorboard --logdir checkpoints` shows every run), sample grids as PNG."""
import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import UserError
from ..files import write_bytes


def tensorboard_writer_class(setting):
    """torch.utils.tensorboard.SummaryWriter, or None when TensorBoard is off. setting: "auto" (on
    when the tensorboard package imports), True (required) or False."""
    if setting not in ("auto", True, False):
        raise UserError(f"tensorboard={setting!r} is not a choice; use auto, true or false.")
    if setting is False:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter   # imports tensorboard: about a second
    except ImportError:
        if setting is True:
            raise UserError("tensorboard=true, but the tensorboard package is not installed; install it with "
                            "pip install tensorboard (or the imagegen[tensorboard] extra), or set tensorboard=auto.") \
                from None
        return None
    return SummaryWriter


def tb_tag(key):
    """metrics.jsonl key -> TensorBoard tag: "val_bpd" -> "val/bpd", "loss" -> "train/loss"; a key that
    holds a "/" is a tag already."""
    if "/" in key:
        return key
    return f"val/{key[4:]}" if key.startswith("val_") else f"train/{key}"


def atomic_write(path, data, what="file"):
    """Write bytes through files.write_bytes (temporary file, fsync, rename; one sentence on failure)."""
    return write_bytes(path, data, what)


class RunLog:
    """The metrics sinks of one run. run_dir: the run folder; tensorboard: "auto" | True | False (see
    tensorboard_writer_class); enabled=False makes every call a no-op (e.g. ranks other than 0).

    .scalars(step, row)         one JSON row {"step": step, **row} in metrics.jsonl, and each number
                                in row as a TensorBoard scalar (tb_tag(key))
    .image(step, tag, image)    image: uint8 H x W x C (C = 1 or 3), numpy or torch; TensorBoard image
                                and run_dir/<tag>/step_000123.png
    .event(step, name, **f)     one JSON row {"event": name, "step": step, **f}
    .truncate_after(step)       on resume from a checkpoint at `step`: keep only the rows with
                                step <= step, then append {"event": "resume", "step": step}
    .close()                    also on leaving a `with RunLog(...)` block
    """

    def __init__(self, run_dir, tensorboard="auto", enabled=True):
        self.run_dir, self.enabled = Path(run_dir), enabled
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self._writer_class = tensorboard_writer_class(tensorboard) if enabled else None
        self._writer, self._purge_step, self._file = None, None, None

    @property
    def tensorboard(self):
        """Whether TensorBoard event files are written."""
        return self._writer_class is not None

    def _append(self, row):
        if self._file is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._file = open(self.metrics_path, "a")
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def _tb(self):
        if self._writer is None and self._writer_class is not None:
            # purge_step hides events at steps >= it left in earlier event files by the run before a resume
            self._writer = self._writer_class(log_dir=str(self.run_dir), purge_step=self._purge_step)
            self._purge_step = None
        return self._writer

    def scalars(self, step, row):
        if not self.enabled:
            return
        self._append({"step": step, **{k: v for k, v in row.items() if k != "step"}})
        writer = self._tb()
        if writer is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    writer.add_scalar(tb_tag(key), value, step)

    def image(self, step, tag, image):
        if not self.enabled:
            return None
        image = np.asarray(image.cpu() if hasattr(image, "cpu") else image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in (1, 3):
            raise ValueError(f"image must be uint8 H x W x C with C 1 or 3, got {image.dtype} {image.shape}")
        folder = self.run_dir / tag
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"step_{step:06d}.png"
        png = io.BytesIO()
        Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image).save(png, format="PNG")
        atomic_write(path, png.getvalue(), "sample grid")
        writer = self._tb()
        if writer is not None:
            writer.add_image(tag, np.repeat(image, 3, axis=2) if image.shape[2] == 1 else image, step,
                             dataformats="HWC")
            writer.flush()
        return path

    def event(self, step, name, **fields):
        if self.enabled:
            self._append({"event": name, "step": step, **fields})

    def truncate_after(self, step):
        """Keep the metrics rows with step <= step (rows a resumed run will log again are dropped, so
        each step appears once), written through a temporary file and os.replace; then append the
        resume event. TensorBoard hides its own events after `step` when it next writes."""
        if not self.enabled:
            return
        self.close()
        kept = []
        if self.metrics_path.exists():
            for line in self.metrics_path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue                        # a row cut short by the crash before this resume
                if isinstance(row, dict) and not (isinstance(row.get("step"), (int, float)) and row["step"] > step):
                    kept.append(line + "\n")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.metrics_path, "".join(kept).encode(), "metrics")
        self._purge_step = step + 1
        self.event(step, "resume")

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
