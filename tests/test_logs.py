"""RunLog: metrics.jsonl rows, TensorBoard event files read back, sample PNGs, resume truncation."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from imagegen.training import logs
from imagegen.errors import UserError
from imagegen.training.logs import RunLog


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_metrics_rows_events_and_png_without_tensorboard(tmp_path):
    with RunLog(tmp_path / "run", tensorboard=False) as log:
        assert not log.tensorboard
        log.scalars(1, {"loss": 2.0, "bpd": 2.885, "lr": 1e-4, "tokens_per_s": 100.0, "elapsed": 1.5})
        log.scalars(2, {"step": 99, "val_bpd": 2.5})              # the step argument wins
        log.event(2, "sample", images=4)
        grid = torch.randint(0, 256, (10, 12, 3), dtype=torch.uint8)
        path = log.image(2, "samples", grid)
    assert rows(tmp_path / "run") == [
        {"step": 1, "loss": 2.0, "bpd": 2.885, "lr": 1e-4, "tokens_per_s": 100.0, "elapsed": 1.5},
        {"step": 2, "val_bpd": 2.5}, {"event": "sample", "step": 2, "images": 4}]
    assert path == tmp_path / "run" / "samples" / "step_000002.png"
    assert np.array_equal(np.asarray(Image.open(path)), grid.numpy())
    assert not list((tmp_path / "run").glob("events.out.tfevents*"))
    grey = np.arange(30, dtype=np.uint8).reshape(5, 6, 1)
    assert np.array_equal(np.asarray(Image.open(RunLog(tmp_path / "run", False).image(7, "samples", grey))),
                          grey[:, :, 0])
    with pytest.raises(ValueError, match="uint8 H x W x C"):
        RunLog(tmp_path / "run", False).image(3, "samples", np.zeros((4, 4, 3), np.float32))


def test_truncate_after_keeps_each_step_once(tmp_path):
    run = tmp_path / "run"
    with RunLog(run, tensorboard=False) as log:
        for step in range(1, 7):
            log.scalars(step, {"loss": float(step)})
            if step % 3 == 0:
                log.scalars(step, {"val_bpd": step / 10})
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "lo')                                 # a row cut short by a crash
    with RunLog(run, tensorboard=False) as log:                    # resumed from a checkpoint at step 4
        log.truncate_after(4)
        for step in (5, 6):
            log.scalars(step, {"loss": 10.0 + step})
    got = rows(run)
    assert got == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0}, {"step": 3, "loss": 3.0},
                   {"step": 3, "val_bpd": 0.3}, {"step": 4, "loss": 4.0}, {"event": "resume", "step": 4},
                   {"step": 5, "loss": 15.0}, {"step": 6, "loss": 16.0}]
    assert not list(run.glob("*.tmp"))
    with RunLog(tmp_path / "fresh", tensorboard=False) as log:     # no metrics yet: just the event
        log.truncate_after(0)
    assert rows(tmp_path / "fresh") == [{"event": "resume", "step": 0}]


def test_disabled_log_writes_nothing(tmp_path):
    with RunLog(tmp_path / "run", tensorboard=True, enabled=False) as log:
        log.scalars(1, {"loss": 1.0})
        log.event(1, "resume")
        log.truncate_after(1)
        assert log.image(1, "samples", np.zeros((2, 2, 3), np.uint8)) is None
    assert not (tmp_path / "run").exists()


def test_tensorboard_setting_errors(monkeypatch, tmp_path):
    with pytest.raises(UserError, match="not a choice"):
        RunLog(tmp_path, tensorboard="yes")
    import builtins
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard") or name.startswith("tensorboard"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(UserError, match="tensorboard package is not installed") as e:
        RunLog(tmp_path, tensorboard=True)
    assert "\n" not in str(e.value)
    assert not RunLog(tmp_path, tensorboard="auto").tensorboard


def test_tensorboard_event_files_read_back(tmp_path):
    pytest.importorskip("tensorboard")                             # CI installs it (the dev extra)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = tmp_path / "run"
    with RunLog(run) as log:
        assert log.tensorboard
        for step in range(1, 5):
            log.scalars(step, {"loss": float(step), "bpd": step / 0.69, "lr": 1e-3})
        log.scalars(4, {"val_bpd": 1.25})
        log.image(2, "samples", np.full((6, 8, 1), 200, np.uint8))
    with RunLog(run) as log:                                       # resume at step 2: steps 3, 4 again
        log.truncate_after(2)
        for step in (3, 4):
            log.scalars(step, {"loss": 100.0 + step})
    assert list(run.glob("events.out.tfevents*"))
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    tags = acc.Tags()
    assert {"train/loss", "train/bpd", "train/lr"} <= set(tags["scalars"]) and tags["images"] == ["samples"]
    # the first run's steps 3 and 4 are purged: each step once, the resumed values
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 1.0), (2, 2.0), (3, 103.0), (4, 104.0)]
    image = acc.Images("samples")[0]
    assert (image.step, image.width, image.height) == (2, 8, 6)
    assert logs.tb_tag("val_bpd") == "val/bpd" and logs.tb_tag("loss") == "train/loss"
    assert logs.tb_tag("grad/norm") == "grad/norm"
