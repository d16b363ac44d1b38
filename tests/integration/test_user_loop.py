"""A user's own training loop (pytorch/examples' mnist/main.py with its elastic lines) on real
mpiexec ranks: stopped and resumed at other sizes, and run by the BackfillExecutor through
preemptions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from parsl_bf.executor.lifecycle import TaskDir
from parsl_bf.training import load_latest
from parsl_bf.training.data import total_steps
from parsl_bf.training.reports import read_reports

from .fragments import ROOT, env, result, run

pytestmark = pytest.mark.slow
LOOP = "parsl_bf.training.examples_loop:main"
EPOCH, BATCH = 1437, 64  # the digits training set and the example's batch size


def test_the_example_runs_by_itself_as_a_plain_script() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "parsl_bf.training.examples_loop", "--epochs", "1"],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "accuracy" in done.stdout


def test_a_loop_stopped_between_steps_resumes_at_other_sizes_exactly(tmp_path: Path) -> None:
    work = 3 * EPOCH
    options = json.dumps({"epochs": 3, "save_model": str(tmp_path / "model.pt")})
    # Stops in the middle of epochs and at an epoch's end, at 2, 1 and 3 ranks.
    for world, stop in ((2, 10 * BATCH), (1, EPOCH), (3, EPOCH + 7 * BATCH)):
        part = run(world, tmp_path, work, task=LOOP, options=options, stop_at=stop)
        assert part.returncode == 0, part.stderr
        assert result(tmp_path)["status"] == "stopped"
        assert result(tmp_path)["samples"] == stop
        assert load_latest(tmp_path / "ckpt")["samples"] == stop
    last = run(2, tmp_path, work, task=LOOP, options=options)
    assert last.returncode == 0, last.stderr
    out = result(tmp_path)
    assert out["status"] == "done" and out["samples"] == work
    assert out["steps"] == total_steps(work, EPOCH, BATCH)  # no step taken twice or skipped
    # One report per epoch, each epoch once, across the four runs.
    assert [h["samples"] for h in out["metrics_history"]] == [EPOCH, 2 * EPOCH, 3 * EPOCH]
    assert out["metrics"]["accuracy"] > 0.5
    assert out["model_path"] == str(tmp_path / "model.pt") and Path(out["model_path"]).is_file()
    state = load_latest(tmp_path / "ckpt")["loop"]
    assert state["values"]["epoch"] == 4  # the loop's own value, committed
    assert state["objects"]["scheduler"]["last_epoch"] == 3


def test_the_loop_runs_on_the_backfill_executor_through_preemptions(tmp_path: Path, monkeypatch):
    import parsl
    from parsl.config import Config

    from parsl_bf.executor import BackfillExecutor, elastic_app
    from parsl_bf.providers import LocalBackfillProvider

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    # 3 emulated nodes, each idle 30 s then busy 6 s, phase-shifted: pilots are preempted
    # without notice when their node turns busy.
    provider = LocalBackfillProvider(
        nodes=3, time_scale=1, idle_s=30, busy_s=6, known_holes=False, max_nodes=1,
        min_walltime="00:00:05", max_walltime="00:30:00", grace_s=5, max_blocks=3,
    )  # fmt: skip
    executor = BackfillExecutor(
        label="bf", provider=provider, allocator={"tfwd": 30}, checkpoint_every=5, rescale_s=5,
        heartbeat_timeout_s=10,
    )  # fmt: skip
    config = Config(executors=[executor], strategy_period=1, run_dir=str(tmp_path / "runinfo"))
    # Long enough (small batches, many epochs) to meet several preemptions: one comes every
    # 12 s or so, whatever the load. The timeout is far beyond the run's time on this machine
    # with both cores busy (a few minutes): how fast the work gets done depends on the load
    # (with more load, more of each hole goes into starting the loop's processes).
    epochs = 50
    train = elastic_app(LOOP, work=epochs * EPOCH)
    with parsl.load(config):
        outcome = train(epochs=epochs, batch_size=16).result(timeout=1800)
    assert outcome["status"] == "done" and outcome["samples"] == epochs * EPOCH
    assert [h["samples"] for h in outcome["metrics_history"]] == [
        k * EPOCH for k in range(1, epochs + 1)
    ]
    assert executor.preemptions >= 1
    (task,) = executor.controller.elastic
    progress = TaskDir.of(executor.directory, task).progress
    starts = [json.loads(x) for x in progress.open() if '"start"' in x]
    assert len(starts) >= 2  # it was stopped and started again, from its checkpoint
    assert any(s["samples"] > BATCH for s in starts[1:])
    # A loop of its own answers an in-place resize by stopping: once it has, it is marked and
    # is asked for none again (resized by restarts only).
    events = read_reports(Path(executor.directory) / "events.jsonl")
    names = [e["event"] for e in events if e.get("task") == task]
    asked = [i for i, n in enumerate(names) if n in ("fragment_shrink", "fragment_grow")]
    marked = [i for i, n in enumerate(names) if n == "task_resizes_by_restart"]
    assert len(marked) <= 1 and (
        not marked or not executor.controller.elastic[task].resizes_in_place
    )
    if marked:
        assert all(i < marked[0] for i in asked)
