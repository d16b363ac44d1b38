"""LocalBackfillProvider with real processes: hole sizing, preemption, cancel, stock HTEX."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from parsl.jobs.states import JobState

from parsl_bf.providers import LocalBackfillProvider

from ..waiting import until
from .htex import square, stock_htex

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
    # Synthetic cycle of 120 trace-s (90 idle), phases 0, 40, 80: at t=0 node0 stays idle until
    # 90, node1 until 50, node2 until 10. Most node-seconds: node0 and node1 until trace second
    # 50 (100 node-s, against 90 for node0 alone), i.e. 5 wall seconds.
    p = _provider(tmp_path, idle_s=90)
    job = p.submit("sleep 30", 1)
    pilot = p.pilots[job]
    assert pilot.state is JobState.RUNNING and pilot.nodes == ["node0", "node1"]
    assert pilot.ends_at - pilot.started_at == pytest.approx(5.0, abs=0.2)
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
    import parsl

    provider = LocalBackfillProvider(
        nodes=2,
        time_scale=1,
        idle_s=3600,
        busy_s=60,
        init_blocks=1,
        max_blocks=1,
        min_walltime="00:00:10",
    )
    with parsl.load(stock_htex(provider, tmp_path / "runinfo", monkeypatch, workers=2)):
        assert [f.result(timeout=120) for f in [square(i) for i in range(10)]] == [
            i * i for i in range(10)
        ]
        assert any(p.state is JobState.RUNNING for p in provider.pilots.values())


@pytest.mark.slow
def test_stock_htex_finishes_every_app_through_preemptions(tmp_path: Path, monkeypatch) -> None:
    import parsl

    # Each node: idle 12 s, busy 4 s, phase-shifted; pilots ask for the maximum walltime and
    # are preempted when a main job (the trace) takes a node back.
    provider = LocalBackfillProvider(
        nodes=2,
        time_scale=1,
        idle_s=12,
        busy_s=4,
        known_holes=False,
        max_nodes=1,
        min_walltime="00:00:01",
        max_walltime="00:10:00",
        grace_s=1.0,
        max_blocks=2,
    )
    with parsl.load(stock_htex(provider, tmp_path / "runinfo", monkeypatch, retries=5)):
        futures = [square(i, 1.0) for i in range(24)]
        assert [f.result(timeout=300) for f in futures] == [i * i for i in range(24)]
    preempted = [p for p in provider.pilots.values() if p.reason == "preempted"]
    assert len(preempted) >= 2 and all(p.state is JobState.TIMEOUT for p in preempted)


def test_sigkill_reaches_processes_in_sessions_of_their_own(tmp_path: Path) -> None:
    # A pilot agent starts ranks in new sessions; a batch system's job container kills them
    # with the job, so the emulation must too.
    p = _provider(tmp_path, known_holes=False, max_walltime="00:10:00")
    pid_file = tmp_path / "detached"
    agent = (
        "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "child = subprocess.Popen(['sleep', '600'], start_new_session=True); "
        f"open('{pid_file}.tmp', 'w').write(str(child.pid)); "
        f"__import__('os').rename('{pid_file}.tmp', '{pid_file}'); time.sleep(600)"
    )
    job = p.submit(f'{sys.executable} -c "{agent}"', 1)
    until(pid_file.exists, 10)
    detached = int(pid_file.read_text())
    until(lambda: p.status([job])[0].state is JobState.TIMEOUT, 15)  # preempted at trace 30 s
    stat = Path(f"/proc/{detached}/stat")
    # Gone, or a zombie nobody reaped (a container's init may not): no longer running.
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
