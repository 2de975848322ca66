"""Sinks for a run's metrics: metrics.jsonl (and, once wired, TensorBoard); rank 0 only."""
import json
import os
from pathlib import Path


class RunLog:
    """metrics.jsonl in run_dir: one JSON row per call, flushed at once."""

    def __init__(self, run_dir, tensorboard=False, enabled=True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.file = open(self.path, "a") if enabled else None

    def scalars(self, step, row):
        self._write({"step": step, **row})

    def event(self, step, name, **fields):
        self._write({"event": name, "step": step, **fields})

    def image(self, step, tag, image):
        """Save a PIL image as run_dir/samples/step_000123.png; returns the path."""
        if not self.enabled:
            return None
        path = self.path.parent / "samples" / f"step_{step:06d}.png"
        path.parent.mkdir(exist_ok=True)
        image.save(path)
        return path

    def truncate_after(self, step):
        """On resume: keep the rows of steps <= step (each step then appears once), mark the restart."""
        if not self.enabled:
            return
        self.file.close()
        rows = [line for line in self.path.read_text().splitlines() if line.strip()]
        kept = [line for line in rows if json.loads(line).get("step", 0) <= step]
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)
        self.file = open(self.path, "a")
        self.event(step, "resume")

    def _write(self, row):
        if self.enabled:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()

    def close(self):
        if self.file:
            self.file.close()
