"""The GPU path with real ranks: model, batches and gradients on the device.

These run where torch sees a CUDA device (a GPU node, or this project's lent GPU machine) and
are skipped elsewhere, saying so: CI's machines have no GPU. The rank layout on GPU nodes (one
rank per GPU, ``cuda:<local rank>``) is tested everywhere, in ``test_executor.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from parsl_bf.training.reports import read_reports

from .fragments import result, run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
]

TASK = "tests.training_tasks:digits_on"


def _train(tmp: Path, ranks: int, device: str, work: int, **extra) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    options = {"device": device, "lr": 0.05, "width": 8, "global_batch": 64}
    done = run(ranks, tmp, work, task=TASK, options=options, **extra)
    assert done.returncode == 0, done.stderr
    return result(tmp)


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_fragment_on_the_gpu_trains_as_it_does_on_the_cpu(tmp_path: Path, ranks: int) -> None:
    gpu = _train(tmp_path / "gpu", ranks, "cuda", 3000)
    cpu = _train(tmp_path / "cpu", ranks, "cpu", 3000)
    assert gpu["status"] == cpu["status"] == "done"
    assert gpu["samples"] == cpu["samples"] == 3000 and gpu["world"] == ranks
    # The same samples in the same steps: the losses agree to the kernels' round-off.
    assert gpu["loss"] == pytest.approx(cpu["loss"], rel=0.05, abs=0.02)
    assert gpu["metrics"]["accuracy"] > 0.5


def test_a_gpu_fragment_stopped_and_resumed_at_another_size_loses_no_sample(
    tmp_path: Path,
) -> None:
    first = _train(tmp_path, 2, "cuda", 3000, stop_at=1280, checkpoint_every=5)
    assert first["status"] == "stopped" and first["samples"] == 1280
    last = _train(tmp_path, 1, "cuda", 3000)
    assert last["status"] == "done" and last["samples"] == 3000
    starts = [r for r in read_reports(tmp_path / "report.jsonl") if r["event"] == "start"]
    assert [s["world"] for s in starts] == [2, 1]
    assert starts[1]["samples"] - 64 <= 1280  # continued from the stop's checkpoint
