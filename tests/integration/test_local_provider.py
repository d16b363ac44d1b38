"""LocalBackfillProvider with real processes: hole sizing, preemption, cancel, stock HTEX."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from parsl.jobs.states import JobState

from parsl_bf.providers import LocalBackfillProvider

from ..waiting import until

# Ignores SIGTERM, so only the SIGKILL after the grace time ends it; logs what it got.
STUBBORN = "trap 'echo TERM >> {log}' TERM; echo $$ > {pid}; while true; do sleep 0.05; done"


def _provider(tmp_path: Path, **kw) -> LocalBackfillProvider:
    p = LocalBackfillProvider(
        **{
            "nodes": 3,
            "time_scale": 10,
            "idle_s": 60,
            "busy_s": 30,
            "min_walltime": "00:00:01",
            "grace_s": 1.0,
            **kw,
        }
    )
    p.script_dir = str(tmp_path)
    return p


def test_pilot_is_sized_to_the_hole(tmp_path: Path) -> None:
    # Synthetic cycle of 90 trace-s, phases 0, 30, 60: at t=0 node0 stays idle until 60 and
    # node1 until 30, node2 is busy. So the pilot gets 2 nodes until trace second 30 (3 s).
    p = _provider(tmp_path)
    job = p.submit("sleep 30", 1)
    pilot = p.pilots[job]
    assert pilot.state is JobState.RUNNING and pilot.nodes == ["node0", "node1"]
    assert pilot.ends_at - pilot.started_at == pytest.approx(3.0, abs=0.2)
    until(lambda: p.status([job])[0].state is JobState.TIMEOUT, 10)
    assert pilot.reason == "walltime"


def test_preemption_sends_sigterm_then_sigkill_and_reports_timeout(tmp_path: Path) -> None:
    p = _provider(tmp_path, known_holes=False, max_walltime="00:10:00")
    log, pid_file = tmp_path / "signals.log", tmp_path / "pid"
    job = p.submit(STUBBORN.format(log=log, pid=pid_file), 1)
    until(lambda: pid_file.exists())
    assert p.pilots[job].ends_at - p.pilots[job].started_at == pytest.approx(600, abs=1)
    until(lambda: log.exists(), 10)  # node1 turns busy at trace 30 s: SIGTERM
    until(lambda: p.status([job])[0].state is JobState.TIMEOUT, 10)
    # The grace time passed between the SIGTERM and the SIGKILL (measured from the signal, not
    # from when the loaded machine let the pilot's trap run).
    assert time.time() - p.pilots[job].signalled_at >= 0.8
    assert p.pilots[job].reason == "preempted"
    assert log.read_text().strip() == "TERM"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_pending_until_a_big_enough_hole(tmp_path: Path) -> None:
    p = _provider(tmp_path, min_nodes=3, max_nodes=3)
    job = p.submit("sleep 30", 1)
    assert p.status([job])[0].state is JobState.PENDING  # only 2 idle nodes at t=0
    time.sleep(0.5)
    assert p.status([job])[0].state is JobState.PENDING
    assert p.cancel([job]) == [True]
    assert p.status([job])[0].state is JobState.CANCELLED
    assert p.cancel(["nope"]) == [False]


def test_cancel_a_running_pilot(tmp_path: Path) -> None:
    p = _provider(tmp_path, known_holes=False)
    job = p.submit("sleep 60", 1)
    assert p.status([job])[0].state is JobState.RUNNING
    p.cancel([job])
    until(lambda: p.status([job])[0].state is JobState.CANCELLED, 10)


def test_repr_for_parsl_logs(tmp_path: Path) -> None:
    text = repr(_provider(tmp_path, known_holes=False, trace=None))
    assert "LocalBackfillProvider(" in text and "known_holes=False" in text


def test_exit_codes(tmp_path: Path) -> None:
    p = _provider(tmp_path, known_holes=False)
    ok, bad = p.submit("true", 1), p.submit("exit 3", 1)
    until(lambda: all(s.terminal for s in p.status([ok, bad])), 10)
    assert [s.state for s in p.status([ok, bad])] == [JobState.COMPLETED, JobState.FAILED]


@pytest.mark.slow
def test_stock_htex_runs_apps_on_local_backfill_pilots(tmp_path: Path, monkeypatch) -> None:
    import sys

    import parsl
    from parsl.app.app import python_app
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor

    # HTEX starts interchange.py and process_worker_pool.py from PATH; its workers unpickle
    # this module's app, so they need the checkout on their path.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    provider = LocalBackfillProvider(
        nodes=2,
        time_scale=1,
        idle_s=3600,
        busy_s=60,
        init_blocks=1,
        max_blocks=1,
        min_walltime="00:00:10",
    )

    @python_app(executors=["bf"])
    def square(x: int) -> int:
        return x * x

    config = Config(
        executors=[HighThroughputExecutor(label="bf", provider=provider, max_workers_per_node=2)],
        run_dir=str(tmp_path / "runinfo"),
    )
    with parsl.load(config):
        assert [f.result(timeout=120) for f in [square(i) for i in range(10)]] == [
            i * i for i in range(10)
        ]
        assert any(p.state is JobState.RUNNING for p in provider.pilots.values())
