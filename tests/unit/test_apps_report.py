"""``elastic_app``'s node bounds, the run report's rows for elastic tasks, and what the progress
thread of ``parsl-bf run`` reads."""

from __future__ import annotations

import csv
import json
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import parsl
import pytest
from parsl.config import Config
from parsl.dataflow.futures import AppFuture
from parsl.dataflow.states import States
from parsl.dataflow.taskrecord import TaskRecord
from parsl.executors import HighThroughputExecutor, ThreadPoolExecutor

from parsl_bf.commands.progress import Progress, writes_status
from parsl_bf.executor import BackfillExecutor
from parsl_bf.executor.apps import elastic_app, node_limit
from parsl_bf.providers import LocalBackfillProvider, SlurmBackfillProvider
from parsl_bf.report import task_columns, task_rows, write_report

TASK = "parsl_bf.training.examples:digits_cnn"


# --- elastic_app ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "limit"),
    [
        (LocalBackfillProvider(nodes=6, max_nodes=2, max_blocks=2), 4),  # 2 pilots of 2 nodes
        (LocalBackfillProvider(nodes=3, max_nodes=2, max_blocks=4), 3),  # the cluster's 3
        (SlurmBackfillProvider(max_nodes=4, max_blocks=3), 12),
    ],
)
def test_node_limit_is_what_the_provider_can_hold(provider, limit: int) -> None:
    assert node_limit(BackfillExecutor(label="bf", provider=provider)) == limit


@pytest.mark.parametrize(("lo", "hi"), [(3, 2), (2, 1)])
def test_elastic_app_refuses_min_above_max(lo: int, hi: int) -> None:
    with pytest.raises(ValueError, match=rf"min_nodes \({lo}\) > max_nodes \({hi}\)"):
        elastic_app(TASK, work=100, min_nodes=lo, max_nodes=hi)


def test_elastic_app_refuses_no_nodes() -> None:
    with pytest.raises(ValueError, match="min_nodes must be at least 1"):
        elastic_app(TASK, work=100, min_nodes=0)


@pytest.fixture
def backfill_dfk(tmp_path: Path) -> Iterator[Any]:
    """A loaded DFK with one BackfillExecutor that never starts a pilot (no scaling): its
    tasks are submitted and recorded, never run."""
    provider = LocalBackfillProvider(nodes=6, max_nodes=2, max_blocks=2)
    config = Config(
        executors=[BackfillExecutor(label="bf", provider=provider)],
        run_dir=str(tmp_path / "runinfo"),
        strategy="none",
    )
    dfk = parsl.load(config)
    try:
        yield dfk
    finally:
        dfk.cleanup()


def test_elastic_app_grows_to_the_executors_nodes_by_default(backfill_dfk) -> None:
    grow = elastic_app(TASK, work=100)(lr=0.1)
    capped = elastic_app(TASK, work=100, max_nodes=2)(lr=0.1)
    wide = elastic_app(TASK, work=100, min_nodes=5)(lr=0.1)  # more than the pilots can hold
    # Parsl records the resource specification when the app is called.
    spec = grow.task_record["resource_specification"]
    assert spec == {
        "work": 100,
        "min_nodes": 1,
        "max_nodes": 4,  # node_limit: 2 pilots of at most 2 nodes
        "task": TASK,
        "options": {"lr": 0.1},
    }
    assert capped.task_record["resource_specification"]["max_nodes"] == 2
    assert wide.task_record["resource_specification"]["max_nodes"] == 5  # never below min
    # The report names such a task by its training function, from the live Parsl record.
    row = task_rows([grow.task_record])[0]
    assert (row["app"], row["executor"], row["work"], row["options"]) == (
        "digits_cnn",
        "bf",
        100,
        "lr=0.1",
    )


# --- the report -----------------------------------------------------------------------------

T0 = datetime(2025, 1, 1, 12, 0, 0)


def _record(
    task_id: int,
    *,
    args: tuple = (),
    spec: dict[str, Any] | None = None,
    func_name: str = "train_in_process",
    result: Any = None,
    error: BaseException | None = None,
) -> TaskRecord:
    """A finished task's record, with the fields the DFK fills in and report.py reads."""
    spec = spec or {}
    record = TaskRecord(
        id=task_id,
        func_name=func_name,
        executor="bf",
        status=States.failed if error is not None else States.exec_done,
        try_id=0,
        fail_count=0,
        args=args,
        kwargs={"parsl_resource_specification": spec} if spec else {},
        resource_specification=spec,
        time_invoked=T0,
        time_returned=T0 + timedelta(seconds=12.5),
        depends=[],
        task_launch_lock=threading.Lock(),
    )
    future = AppFuture(record)
    record["app_fu"] = future
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
    return record


def _outcome(**metrics: float) -> dict[str, Any]:
    """What a BackfillExecutor's elastic task resolves with: a TrainOutcome as a dict."""
    return {
        "status": "done",
        "samples": 500,
        "steps": 5,
        "world": 2,
        "loss": 0.25,
        "checkpoint": None,
        "metrics": metrics,
    }


def _elastic(task_id: int, task: str = TASK, **metrics: float) -> TaskRecord:
    spec = {"work": 500, "min_nodes": 1, "max_nodes": 4, "task": task, "options": {"lr": 0.1}}
    return _record(
        task_id,
        args=(task, {"lr": 0.1}, 500),
        spec=spec,
        result=_outcome(**metrics),
    )


def test_task_rows_name_the_users_task_and_its_metrics() -> None:
    records = [
        _elastic(1, "workflows.mine:regressor", val_loss=0.42),
        _elastic(0, accuracy=0.9, params=2000.0),
        # The one-rank fallback on a stock executor: no resource specification.
        _record(2, args=(TASK, {"lr": 0.2}, 300), result=_outcome(accuracy=0.8)),
        _record(3, func_name="plain", result=7),
        _record(4, args=(TASK, {}, 300), error=RuntimeError("boom\nsecond line")),
    ]
    rows = task_rows(records)
    assert [r["task"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["app"] for r in rows] == [
        "digits_cnn",
        "regressor",
        "digits_cnn",
        "plain",
        "digits_cnn",
    ]
    assert rows[1]["metrics"] == {"val_loss": 0.42}
    assert (rows[1]["samples"], rows[1]["world"], rows[1]["loss"]) == (500, 2, 0.25)
    assert (rows[2]["work"], rows[2]["options"], rows[2]["metrics"]) == (
        300,
        "lr=0.2",
        {"accuracy": 0.8},
    )
    assert rows[3]["metrics"] == {} and rows[3]["seconds"] == 12.5
    assert rows[4]["error"] == "RuntimeError: boom" and rows[4]["state"] == "failed"
    columns = task_columns(rows)
    assert columns[-4:] == ["accuracy", "params", "val_loss", "error"]
    assert "train_in_process" not in {r["app"] for r in rows}


def _report(tmp_path: Path, records: list[TaskRecord]) -> tuple[str, list[dict[str, str]]]:
    write_report(
        tmp_path,
        workflow="wf.py",
        command="parsl-bf run wf.py",
        config="c.yaml",
        started="2025-01-01T12:00:00",
        elapsed_s=1.0,
        run_dirs=[],
        summary=None,
        tasks=task_rows(records),
        samples=[],
        snapshots=[],
        preemptions=0,
    )
    with (tmp_path / "tasks.csv").open() as f:
        return (tmp_path / "report.md").read_text(), list(csv.DictReader(f))


def test_report_has_a_column_per_metric(tmp_path: Path) -> None:
    # An evaluation "loss" must not overwrite the final training loss.
    md, csv_rows = _report(tmp_path, [_elastic(0, val_loss=0.42, loss=0.5), _elastic(1)])
    header = next(line for line in md.splitlines() if line.startswith("| task |"))
    assert header.endswith("| loss | val_loss | metrics.loss | error |")
    assert "| digits_cnn |" in md and "train_in_process" not in md
    assert "| 0.25 | 0.42 | 0.5 |" in md
    assert csv_rows[0]["val_loss"] == "0.42" and csv_rows[0]["metrics.loss"] == "0.5"
    assert csv_rows[1]["val_loss"] == "" and csv_rows[1]["app"] == "digits_cnn"


def test_report_folds_many_metrics_into_one_column(tmp_path: Path) -> None:
    many = {f"m{i}": float(i) for i in range(8)}
    md, csv_rows = _report(tmp_path, [_elastic(0, **many)])
    header = next(line for line in md.splitlines() if line.startswith("| task |"))
    assert header.endswith("| loss | metrics | error |")
    assert "m0=0, m1=1, m2=2" in md
    assert [csv_rows[0][f"m{i}"] for i in range(8)] == [str(float(i)) for i in range(8)]


def test_report_marks_an_impossible_efficiency_as_not_a_result(tmp_path: Path) -> None:
    def snapshot(e_used: float) -> dict:
        accounting = {"util": 0.6, "E_used": e_used, "E_avail": 0.4}
        if e_used > 1.02:  # as the controller marks it
            accounting["suspect"] = "E_used above 1: not a measurement of this run"
        elif e_used > 1:
            accounting["noise"] = "E_used above 1 by at most 0.02: the noise of the one-node rate"
        return {"label": "bf", "path": "status.json", "accounting": accounting}

    for e_used, marked in ((0.71, False), (1.065, True), (1.003, False)):
        write_report(
            tmp_path, workflow="wf.py", command="c", config="c.yaml", started="s",
            elapsed_s=1.0, run_dirs=[], summary=None, tasks=[], samples=[],
            snapshots=[snapshot(e_used)], preemptions=0,
        )  # fmt: skip
        md = (tmp_path / "report.md").read_text()
        assert f"E_used {e_used}" in md
        assert ("**Not a result:** E_used above 1" in md) is marked
        assert ("**Not an efficiency above 1:** E_used" in md) is (1 < e_used <= 1.02)


# --- the progress thread --------------------------------------------------------------------


class _Renamed(BackfillExecutor):
    """A BackfillExecutor by another name: still one that writes its own status."""


def test_progress_reads_the_status_of_executors_that_write_their_own(tmp_path: Path) -> None:
    provider = LocalBackfillProvider(nodes=4, max_nodes=2, max_blocks=2)
    executors = [
        BackfillExecutor(label="bf", provider=provider),
        _Renamed(label="bf2", provider=LocalBackfillProvider(nodes=4, max_nodes=2)),
        HighThroughputExecutor(label="htex"),
        ThreadPoolExecutor(label="threads"),
    ]
    assert [writes_status(e) for e in executors] == [True, True, False, False]
    assert not writes_status(mock.MagicMock())  # by the flag's value, not by having it
    progress = Progress(Config(executors=executors), live=False)
    assert progress.backfill == 2

    run_dir = tmp_path / "runinfo" / "000"
    for label, rate in (("bf", 2.5), ("bf2", 1.0)):
        (run_dir / label).mkdir(parents=True)
        snapshot = {
            "label": label,
            "preemptions": 1,
            "pilots": [{"pilot": f"{label}-0", "nodes": ["n0", "n1", "n2"]}],
            "tasks": [{"task": 0, "nodes": 2, "rate": rate}],
        }
        (run_dir / label / "status.json").write_text(json.dumps(snapshot))
    dfk = mock.Mock(run_dir=str(run_dir), task_state_counts_lock=threading.Lock())
    dfk.task_state_counts = {States.running: 2, States.exec_done: 1}
    progress.dfks.append(dfk)
    for _ in range(2):  # the second time from the paths found the first time
        s = progress.sample()
        seen = (s.running, s.done, s.in_use, s.idle, s.rate, s.preemptions)
        assert seen == (2, 1, 4, 2, 3.5, 2)
