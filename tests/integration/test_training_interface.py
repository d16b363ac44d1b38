"""A user's own PyTorch task (Dataset of memmaps with DataLoader workers, BatchNorm, AdamW with
a warm-up/cosine schedule, clipping, bf16 autocast, a custom two-term step, periodic
evaluation, extra state, a saved model) on real mpiexec ranks, rescaled and not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from parsl_bf.training import load_latest

from ..training_tasks import write_waveforms
from .fragments import result, run

pytestmark = pytest.mark.slow
TASK = "tests.training_tasks:waveform_cnn"
TRAIN, BATCH = 480, 32  # the task's epoch (15 full steps) and global batch


def _run(world: int, tmp: Path, work: int, data: Path, precision: str, **extra):
    opts = {"data": str(data), "save_model": str(tmp / "model.pt"), "precision": precision}
    done = run(world, tmp, work, task=TASK, options=json.dumps(opts), **extra)
    assert done.returncode == 0, done.stderr
    return result(tmp)


# Floating-point tolerance of each precision: fp32 agrees to its rounding; bf16 autocast
# rounds activations to 8 bits of mantissa (epsilon 2^-8), and a rank's share of a different
# size may take another kernel, so its runs agree to bf16's rounding.
TOLERANCE = {"fp32": (1e-4, 1e-5), "bf16": (1e-2, 1e-3)}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_rescaled_run_of_a_users_task_equals_the_uninterrupted_run(
    tmp_path: Path, precision: str
) -> None:
    rtol, atol = TOLERANCE[precision]
    data = tmp_path / "data"
    data.mkdir()
    write_waveforms(data)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    work = 2 * TRAIN + 200
    done = _run(2, whole, work, data, precision)
    # Boundaries on the step grid: 2 → 1 → 3 → 2, with checkpoints between.
    # The same total work throughout (the schedule spans it), each part stopped at its step.
    for world, upto in ((2, 10 * BATCH), (1, TRAIN + 2 * BATCH), (3, TRAIN + 12 * BATCH)):
        step = _run(world, parts, work, data, precision, stop_at=upto)
        assert step["status"] == "stopped" and step["samples"] == upto
        assert step["world"] == world
    last = _run(2, parts, work, data, precision)
    assert last["samples"] == done["samples"] == work and last["steps"] == done["steps"]
    assert last["loss"] == pytest.approx(done["loss"], rel=rtol)
    a, b = load_latest(whole / "ckpt"), load_latest(parts / "ckpt")
    # The schedule went on across the rescales: same step count and learning rate.
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"] == done["steps"]
    assert a["scheduler"]["_last_lr"] == pytest.approx(b["scheduler"]["_last_lr"], rel=1e-6)
    for name in a["model"]:  # BatchNorm's running statistics included
        torch.testing.assert_close(a["model"][name], b["model"][name], rtol=rtol, atol=atol)
    # Extra state: every step counted once, whatever the world size.
    assert (
        a["user_state"]["counter"]["steps"] == b["user_state"]["counter"]["steps"] == last["steps"]
    )
    # Periodic evaluations, each with its samples, kept across the rescales.
    seen = [h["samples"] for h in last["metrics_history"]]
    assert seen == [h["samples"] for h in done["metrics_history"]]
    assert seen == sorted(seen) and seen[-1] == work and len(seen) >= 4
    for h, g in zip(last["metrics_history"], done["metrics_history"], strict=True):
        assert h["val_loss"] == pytest.approx(g["val_loss"], rel=rtol)
    # The final model, written by rank 0.
    saved = torch.load(last["model_path"], weights_only=True)
    assert Path(last["model_path"]) == parts / "model.pt"
    torch.testing.assert_close(saved["0.weight"], b["model"]["0.weight"])


def test_an_iterable_dataset_is_refused_with_the_reason(tmp_path: Path) -> None:
    done = run(1, tmp_path, 100, task="tests.training_tasks:iterable_dataset")
    assert done.returncode == 2
    assert "dataset: returned an IterableDataset" in done.stderr
    assert "map-style Dataset" in done.stderr
