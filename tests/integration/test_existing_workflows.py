"""Existing Parsl workflows on backfill pilots, with the shipped configs: every app finishes
through unannounced preemptions, a preemption costs no retry, and pilots that cannot start
fail the tasks loudly after a bounded number of blocks instead of hanging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from parsl.app.app import python_app

import parsl_bf
from workflows import mapreduce

from ..waiting import until
from .htex import square
from .slurm import job, run, sbatch

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
HTEX_LOCAL = ROOT / "configs" / "htex-local-backfill.yaml"
HTEX_SLURM = ROOT / "configs" / "htex-slurm-backfill.yaml"
# Never reached unless something hangs: a guard, not a measurement.
HANG_S = 900


@python_app
def any_square(x: int, pause: float = 0.0) -> int:
    """``square`` on whichever executor the config has (the shipped configs' labels differ)."""
    import time

    time.sleep(pause)
    return x * x


def _venv_env() -> dict[str, str]:
    """An activated environment, as a user's shell has it (HTEX starts interchange.py from
    PATH); nothing of the checkout on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_mapreduce_from_outside_the_checkout_finishes_through_preemptions(tmp_path) -> None:
    # The shipped config by its path, run from a directory that is not the checkout.
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "workflows" / "mapreduce.py"),
            "--config",
            str(HTEX_LOCAL),
            "--out",
            "data",
            "--pause",
            "3",
        ],
        cwd=tmp_path,
        env=_venv_env(),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["apps"] >= 300
    assert summary["total_ok"] and summary["file_ok"]
    # Preemptions happened during the run, and none of them failed it.
    assert summary["pilot_ends"].get("preempted", 0) >= 2, summary
    assert (tmp_path / "data" / "all-squares.txt").is_file()
    status = json.loads(
        next((tmp_path / "runinfo").glob("*/htex_backfill/status.json")).read_text()
    )
    assert status["failed_blocks"] == 0
    assert any(b["reason"] == "preempted" and b["outcome"] == "ended" for b in status["blocks"])


def test_a_preemption_costs_no_retry(tmp_path, monkeypatch) -> None:
    import parsl

    monkeypatch.setenv("PATH", _venv_env()["PATH"])
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the workers unpickle this package's apps
    monkeypatch.chdir(tmp_path)
    config = parsl_bf.load_config(HTEX_LOCAL)
    # No retries at all: a task lost with a preempted pilot must still finish.
    config.retries, config.garbage_collect, config.run_dir = 0, False, str(tmp_path / "runinfo")
    provider = config.executors[0].provider
    with parsl.load(config) as dfk:
        lost = False
        for wave in range(12):  # tasks keep every worker busy until a preemption hits one
            futures = [any_square(wave * 100 + i, 3.0) for i in range(16)]
            assert [f.result(timeout=HANG_S) for f in futures] == [
                (wave * 100 + i) ** 2 for i in range(16)
            ]
            lost = any(t["fail_count"] > 0 for t in dfk.tasks.values())
            if lost:
                break
        assert lost, "no task was lost with a preempted pilot"
        retried = [t for t in dfk.tasks.values() if t["fail_count"] > 0]
        assert all(t["fail_cost"] == 0 for t in retried)
        assert any(p.reason == "preempted" for p in provider.pilots.values())


def test_a_bad_worker_init_fails_the_tasks_after_a_bounded_number_of_blocks(
    tmp_path, monkeypatch, capfd
) -> None:
    import parsl
    from parsl.executors.errors import BadStateException

    monkeypatch.setenv("PATH", _venv_env()["PATH"])
    monkeypatch.chdir(tmp_path)
    config = parsl_bf.load_config(HTEX_LOCAL)
    config.run_dir = str(tmp_path / "runinfo")
    provider = config.executors[0].provider
    provider.worker_init = "source /nonexistent/.venv/bin/activate || exit 1"
    handler = config.executors[0].block_error_handler
    with parsl.load(config):
        future = any_square(3)
        with pytest.raises(BadStateException) as caught:
            future.result(timeout=HANG_S)
    assert "/nonexistent/.venv/bin/activate: No such file or directory" in str(caught.value)
    assert "backfill pilots in a row failed" in str(caught.value)
    # Bounded: the handler's threshold, plus at most the blocks that were already starting.
    assert handler.threshold <= len(provider.pilots) <= handler.threshold + provider.max_blocks
    # Loud: each failed block on the console, and in the status that `parsl-bf status` reads.
    assert "block 0 failed" in capfd.readouterr().err
    status = json.loads(
        next((tmp_path / "runinfo").glob("*/htex_backfill/status.json")).read_text()
    )
    assert status["failed_blocks"] >= handler.threshold
    shown = subprocess.run(
        [str(Path(sys.executable).with_name("parsl-bf")), "status", str(tmp_path / "runinfo")],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=HANG_S,
    )
    assert shown.returncode == 0, shown.stderr
    for text in ("htex_backfill", "HighThroughputExecutor", "failed blocks", "No such file"):
        assert text in shown.stdout


def test_backfill_executor_fails_its_tasks_when_pilots_cannot_start(tmp_path, monkeypatch) -> None:
    import parsl
    from parsl.config import Config
    from parsl.executors.errors import BadStateException
    from parsl.jobs.errors import TooManyJobFailuresError

    from parsl_bf.executor import BackfillExecutor
    from parsl_bf.providers import BackfillErrorHandler, LocalBackfillProvider
    from parsl_bf.providers.handlers import hold_deadline

    monkeypatch.chdir(tmp_path)
    provider = LocalBackfillProvider(
        nodes=2, time_scale=1, idle_s=3600, busy_s=60, min_walltime="00:00:10",
        worker_init="echo no agent here >&2; exit 3", init_blocks=1, max_blocks=1,
    )  # fmt: skip
    # A short back-off keeps the test quick; the strategy asks for a pilot every second.
    handler = BackfillErrorHandler(backoff_s=0.5, max_backoff_s=5.0)
    executor = BackfillExecutor(label="bf", provider=provider, block_error_handler=handler)
    config = Config(executors=[executor], run_dir=str(tmp_path / "runinfo"), strategy_period=1)
    with parsl.load(config):
        future = square(2)
        with pytest.raises(BadStateException) as caught:
            future.result(timeout=HANG_S)
        assert "no agent here" in str(caught.value)
        with pytest.raises(TooManyJobFailuresError, match="no agent here"):  # no more work
            square(3).result(timeout=HANG_S)
        # `parsl-bf status` shows the failed starts (the executor rewrites it every second).
        until(lambda: _status(tmp_path / "runinfo", "bf").get("failed_blocks", 0) >= 3, HANG_S)
    # Bounded: the threshold, plus at most the blocks that were already starting.
    assert handler.threshold <= len(provider.pilots) <= handler.threshold + provider.max_blocks
    # Backed off: each pilot was submitted, in order, only once the hold that the failures
    # before it set had run out (the event log's times are rounded to the millisecond).
    events = _events(tmp_path / "runinfo", "bf")
    submitted = [(e["t"], int(b)) for e in events if e["event"] == "blocks_submitted"
                 for b in e["blocks"]]  # fmt: skip
    assert [b for _, b in submitted] == list(range(len(provider.pilots)))
    records = sorted(handler.blocks.values(), key=lambda r: int(r.block))
    assert all(r.outcome == "failed" and r.failed_at is not None for r in records)
    deadlines = []
    for t, block in submitted[1:]:
        deadline = round(hold_deadline(records[:block], 0.5, 5.0), 3)
        assert t >= deadline, (block, t, deadline)
        deadlines.append(deadline)
    # The strategy asked for a pilot during a hold and got none: each refusal names a hold
    # that the failures set, and the next submission came after it.
    held = [e for e in events if e["event"] == "pilots_held"]
    assert held
    for h in held:
        assert h["until"] in deadlines, (h, deadlines)
        assert all(t >= h["until"] for t, _ in submitted if t >= h["t"])


def test_mapreduce_on_slurm_finishes_while_main_jobs_preempt(slurm, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", _venv_env()["PATH"])
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the workers import workflows.mapreduce
    config = parsl_bf.load_config(HTEX_SLURM)
    config.run_dir = str(tmp_path / "runinfo")
    provider = config.executors[0].provider
    result: dict = {}
    workflow = threading.Thread(
        target=lambda: result.update(
            mapreduce.main(["--out", "data", "--chunks", "40", "--pause", "2"], config)
        )
    )
    workflow.start()
    # Main jobs that need the whole cluster arrive while the workflow runs; each preempts the
    # pilots there.
    mains = 0
    while workflow.is_alive() and mains < 2:
        until(lambda: not workflow.is_alive() or _running_pilots(provider), HANG_S)
        if not workflow.is_alive():
            break
        main = sbatch(slurm, "main", 4, "sleep 5", "--time=1")
        until(lambda m=main: job(slurm, m)["JobState"] in ("RUNNING", "COMPLETED"), HANG_S)
        mains += 1
    workflow.join(HANG_S)
    assert not workflow.is_alive()
    assert result["apps"] >= 200 and result["total_ok"] and result["file_ok"], result
    assert mains >= 1 and result["pilot_ends"].get("preempted", 0) >= 1, result
    run(slurm, "squeue")  # the cluster still answers


def _running_pilots(provider) -> bool:
    from parsl.jobs.states import JobState

    return any(p.state is JobState.RUNNING for p in list(provider.pilots.values()))


def _events(run_dir: Path, label: str) -> list[dict]:
    """The executor's event log, in the order it was written."""
    path = next(run_dir.glob(f"*/{label}/events.jsonl"))
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _status(run_dir: Path, label: str) -> dict:
    """The executor's status snapshot, as `parsl-bf status` reads it."""
    return json.loads(next(run_dir.glob(f"*/{label}/status.json")).read_text())
