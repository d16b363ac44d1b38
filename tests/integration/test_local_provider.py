"""LocalBackfillProvider with real processes: hole sizing, preemption, cancel, stock HTEX."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from parsl.jobs.states import JobState

from parsl_bf.providers import LocalBackfillProvider

from ..waiting import until
from .htex import square, stock_htex

# Ignores SIGTERM (so does each sleep it starts), so only the SIGKILL after the grace time
# ends it; writes its pid once it does. The launcher's script around it dies of the SIGTERM.
STUBBORN = (
    "trap '' TERM; echo $BASHPID > {pid}.tmp && mv {pid}.tmp {pid}; while true; do sleep 0.05; done"
)


@pytest.fixture
def make(tmp_path: Path):
    """LocalBackfillProviders on a 3-node synthetic cycle (120 trace-s per wall second / 12),
    each closed (pilots ended, emulation thread stopped) when the test ends."""
    made: list[LocalBackfillProvider] = []

    def make(**kw) -> LocalBackfillProvider:
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
        made.append(p)
        return p

    yield make
    for p in made:
        p.close(timeout=120)


class TraceClock:
    """The emulated machine's trace second, set by the test instead of the wall clock: the
    emulation preempts when the test moves it, however slowly the machine starts the pilots."""

    def __init__(self, provider: LocalBackfillProvider, monkeypatch, t: float = 0.0) -> None:
        self.t = t
        monkeypatch.setattr(provider, "trace_time", lambda wall=None: self.t)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: gone, or a zombie nobody reaped (a container's init may not), is
    not running."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def test_pilot_is_sized_to_the_hole(make) -> None:
    # Synthetic cycle of 120 trace-s (90 idle), phases 0, 40, 80: at t=0 node0 stays idle until
    # 90, node1 until 50, node2 until 10. Most node-seconds: node0 and node1 until trace second
    # 50 (100 node-s, against 90 for node0 alone), i.e. 5 wall seconds. The first pilot is
    # sized at trace second 0 exactly, however long the submit took.
    p = make(idle_s=90)
    job = p.submit("sleep 30", 1)
    pilot = p.pilots[job]
    assert pilot.state is JobState.RUNNING and pilot.nodes == ["node0", "node1"]
    assert pilot.ends_at - pilot.started_at == pytest.approx(5.0)
    until(lambda: p.status([job])[0].state is JobState.TIMEOUT, 60)
    assert pilot.reason == "walltime"


def test_preemption_sends_sigterm_then_sigkill_and_reports_timeout(make, monkeypatch) -> None:
    p = make(known_holes=False, max_walltime="00:10:00")
    clock = TraceClock(p, monkeypatch)
    pid_file = Path(p.script_dir) / "pid"
    job = p.submit(STUBBORN.format(pid=pid_file), 1)
    pilot, record = p.pilots[job], p._jobs[job]
    assert "node1" in pilot.nodes and pilot.ends_at - pilot.started_at == 600  # max_walltime
    until(pid_file.exists, 60)
    stubborn = int(pid_file.read_text())
    clock.t = 35  # node1 turned busy at trace second 30: a main job takes it back
    until(lambda: p.status([job])[0].state is JobState.TIMEOUT, 60)
    assert pilot.reason == "preempted" and pilot.signalled_at == record.term_sent
    # Order and cause: SIGTERM to the whole pilot first (its first process, the launcher's
    # script, died of it), then, the grace time passed on the provider's clock with a process
    # still there (the stubborn one), SIGKILL.
    assert record.proc.returncode == -signal.SIGTERM
    assert record.kill_sent is not None and record.kill_sent - record.term_sent >= p.grace_s
    assert not _running(stubborn)


def test_a_pilot_gone_is_never_signalled_again(make, monkeypatch) -> None:
    # Its first process is reaped once every process of it is gone; its pid may then be
    # another process's (a pilot of another provider, say), so no signal goes there again.
    p = make(known_holes=False)
    TraceClock(p, monkeypatch)
    job = p.submit("sleep 600", 1)
    assert p.cancel([job]) == [True]
    until(lambda: p.status([job])[0].state is JobState.CANCELLED, 60)
    record = p._jobs[job]
    assert record.proc.returncode == -signal.SIGTERM  # reaped by the provider
    sent = []
    monkeypatch.setattr(os, "kill", lambda *a: sent.append(a))
    monkeypatch.setattr(os, "killpg", lambda *a: sent.append(a))
    p._signal(record, signal.SIGKILL)
    assert p.cancel([job]) == [False]
    assert sent == []


def test_pending_until_a_big_enough_hole(make) -> None:
    p = make(min_nodes=3, max_nodes=3)
    job = p.submit("sleep 30", 1)
    assert p.status([job])[0].state is JobState.PENDING  # only 2 idle nodes at t=0
    time.sleep(0.5)
    assert p.status([job])[0].state is JobState.PENDING  # never 3 at once in this cycle
    assert p.cancel([job]) == [True]
    assert p.status([job])[0].state is JobState.CANCELLED
    assert p.cancel(["nope"]) == [False]
    assert p.status(["nope"])[0].state is JobState.UNKNOWN


def test_cancel_a_running_pilot(make, monkeypatch) -> None:
    p = make(known_holes=False)
    TraceClock(p, monkeypatch)
    job = p.submit("sleep 60", 1)
    assert p.status([job])[0].state is JobState.RUNNING
    assert p.cancel([job, job]) == [True, False]  # the same pilot twice: ended once
    until(lambda: p.status([job])[0].state is JobState.CANCELLED, 60)
    status = p.status([job])[0]
    assert status.message == "cancelled"
    assert status.stdout_path == str(Path(p.script_dir) / f"{job}.stdout")


def test_emulation_thread_runs_only_while_pilots_are_live(make, monkeypatch) -> None:
    p = make(known_holes=False)
    TraceClock(p, monkeypatch)
    job = p.submit("sleep 600", 1)
    thread = p._thread
    assert thread is not None and thread.is_alive()
    p.close(timeout=120)  # ends the pilot, then the thread
    assert p.pilots[job].state is JobState.CANCELLED
    assert not thread.is_alive() and p._thread is None
    again = p.submit("true", 1)  # a new pilot starts the emulation again
    until(lambda: p.status([again])[0].state is JobState.COMPLETED, 60)
    until(lambda: p._thread is None, 60)  # and it stops by itself once no pilot is live


def test_repr_for_parsl_logs(make) -> None:
    text = repr(make(known_holes=False, trace=None))
    assert "LocalBackfillProvider(" in text and "known_holes=False" in text


def test_exit_codes(make, monkeypatch) -> None:
    p = make(known_holes=False)
    TraceClock(p, monkeypatch)  # no preemption, however long the pilots take to start
    ok, bad = p.submit("true", 1), p.submit("exit 3", 1)
    until(lambda: all(s.terminal for s in p.status([ok, bad])), 60)
    assert [s.state for s in p.status([ok, bad])] == [JobState.COMPLETED, JobState.FAILED]


def test_pinned_pilots_run_on_their_nodes_cores_only(make, monkeypatch, tmp_path) -> None:
    p = make(known_holes=False, max_nodes=1, pin_cores=True)
    TraceClock(p, monkeypatch)
    # Each pilot's processes, a grandchild here, say which cores they may run on.
    jobs = [p.submit(f"grep Cpus_allowed_list /proc/self/status > {tmp_path}/cores-{i}", 1)
            for i in range(2)]  # fmt: skip
    until(lambda: all(s.terminal for s in p.status(jobs)), 60)
    cpus = os.cpu_count() or 1
    for i, job in enumerate(jobs):
        (node,) = p.pilots[job].nodes
        allowed = (tmp_path / f"cores-{i}").read_text().split()[-1]
        assert allowed == str(int(node.removeprefix("node")) % cpus)


@pytest.mark.slow
def test_stock_htex_runs_apps_on_local_backfill_pilots(
    tmp_path: Path, monkeypatch, request
) -> None:
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
    request.addfinalizer(lambda: provider.close(timeout=120))
    with parsl.load(stock_htex(provider, tmp_path / "runinfo", monkeypatch, workers=2)):
        assert [f.result(timeout=120) for f in [square(i) for i in range(10)]] == [
            i * i for i in range(10)
        ]
        assert any(p.state is JobState.RUNNING for p in provider.pilots.values())


@pytest.mark.slow
def test_stock_htex_finishes_every_app_through_preemptions(
    tmp_path: Path, monkeypatch, request
) -> None:
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
    request.addfinalizer(lambda: provider.close(timeout=120))
    with parsl.load(stock_htex(provider, tmp_path / "runinfo", monkeypatch, retries=5)):
        futures = [square(i, 1.0) for i in range(24)]
        assert [f.result(timeout=300) for f in futures] == [i * i for i in range(24)]
    # A pilot preempted as the workflow ended may still be in its grace time: wait until every
    # pilot's processes are gone (a preempted one keeps its reason) before reading states.
    provider.close(timeout=120)
    preempted = [p for p in provider.pilots.values() if p.reason == "preempted"]
    assert len(preempted) >= 2 and all(p.state is JobState.TIMEOUT for p in preempted)


def test_sigkill_reaches_processes_in_sessions_of_their_own(make, monkeypatch) -> None:
    # A pilot agent starts ranks in new sessions; a batch system's job container kills them
    # with the job, so the emulation must too.
    p = make(known_holes=False, max_walltime="00:10:00")
    clock = TraceClock(p, monkeypatch)
    pid_file = Path(p.script_dir) / "detached"
    agent = (
        "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "child = subprocess.Popen(['sleep', '600'], start_new_session=True); "
        f"open('{pid_file}.tmp', 'w').write(str(child.pid)); "
        f"__import__('os').rename('{pid_file}.tmp', '{pid_file}'); time.sleep(600)"
    )
    job = p.submit(f'{sys.executable} -c "{agent}"', 1)
    until(pid_file.exists, 60)
    detached = int(pid_file.read_text())
    clock.t = 35  # node1 turned busy at trace second 30: preempted
    until(lambda: p.status([job])[0].state is JobState.TIMEOUT, 60)
    assert p._jobs[job].kill_sent is not None  # the agent outlived the grace time
    assert not _running(detached)
