"""Fragment ranks on a real agent's standby ranks (real ``mpiexec``, MPI, torch and sockets)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from pathlib import Path

import pytest

from parsl_bf import environment
from parsl_bf.executor.channel import PilotGone, PilotUp, ProcessExited
from parsl_bf.pilot import relay, standby, warmhost
from parsl_bf.pilot.ranks import REFILL_DELAY_S, RankPool, rank_argv
from parsl_bf.pilot.wire import RANKS_KEY
from parsl_bf.training.command import MPIEXEC, worker_argv
from parsl_bf.training.reports import read_reports

from ..waiting import until
from .agents import END, alive, launch
from .fragments import descends

pytestmark = pytest.mark.slow

TASK = "parsl_bf.training.examples:digits_cnn"


def _ready_pids(stderr: Path) -> list[int]:
    text = stderr.read_text() if stderr.exists() else ""
    return [int(p) for p in re.findall(r"standby rank ready \(pid (\d+)\)", text)]


def _processes(agent: int, match) -> list[int]:
    """PIDs of the live processes under ``agent`` whose argv ``match(argv)`` accepts."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if match(argv) and descends(int(proc.name), agent) and alive(int(proc.name)):
                found.append(int(proc.name))
    return found


def _standbys_of(agent: int) -> list[int]:
    """PIDs of the standby ranks (the Python processes) or relays an agent's pool started."""
    return _processes(
        agent,
        lambda argv: (
            argv[2:3] == [standby.MODULE.encode()]
            or argv[1:3] == [b"-I", b"-S"]
            and argv[3] == relay.__file__.encode()
        ),
    )


def _rank_hosts_of(agent: int) -> list[int]:
    """PIDs of an agent's rank host and the ranks it forked (their argv is the host's)."""
    return _processes(agent, lambda argv: warmhost.MODULE.encode() in argv[:3]
                      and b"--ranks" in argv)  # fmt: skip


@pytest.fixture(params=["fork", "standby"])
def mode(request, monkeypatch) -> str:
    """Both ways a CPU node's warm ranks start: forked from the rank host (relays), or as
    standby processes (``PARSL_BF_FORK_RANKS=0``; GPU nodes, and launchers without a PMI port)."""
    monkeypatch.setenv(environment.FORK_RANKS, "1" if request.param == "fork" else "0")
    return request.param


def _pilot_up(serve, agent, tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    """A fresh server and an agent (pilot.1, ``args`` on its command line) registered with it:
    ``(server, events, the agent's process, its stderr file)``."""
    server, events = serve()
    proc = agent(server.url, "pilot.1", *args, env=env)
    events.wait(PilotUp("pilot.1", ("n0", "n1"), END, socket.gethostname()))
    return server, events, proc, tmp_path / "pilot.1.stderr"


def _ranks_launch(key: str, tmp: Path, ranks: int, work: int, first: int = 0) -> dict:
    d = tmp / key
    d.mkdir()
    flags = {"report": d / "progress.jsonl", "result": d / "result.json"}
    if ranks > 1:
        flags["rendezvous"] = d / "rendezvous"
    msg = launch(key, worker_argv(TASK, work, d / "ckpt", {}, **flags), d, cwd=str(d))
    msg["env"] = {"PARSL_BF_THREADS_PER_RANK": "1"}
    msg[RANKS_KEY] = {"first": first, "count": ranks, "of": ranks, "mpiexec": MPIEXEC}
    return msg


def test_rank_argv_makes_each_rank_its_own_group() -> None:
    assert rank_argv(["w"], 0, 1) == ["w"]
    assert rank_argv(["w"], 2, 3) == ["w", "--group", "2", "--groups", "3"]


def test_fragment_ranks_start_on_standbys_and_train_every_sample(
    serve, agent, tmp_path: Path, mode: str
) -> None:
    server, events, proc, stderr = _pilot_up(serve, agent, tmp_path)
    # Three standbys: a fragment of three ranks joins three MPI worlds (three groups).
    server.send("pilot.1", {"op": "warm_ranks", "size": 3, "mpiexec": MPIEXEC})
    until(lambda: len(_ready_pids(stderr)) == 3, 120, "the standbys never became ready")
    standbys = _ready_pids(stderr)

    server.send("pilot.1", _ranks_launch("frag", tmp_path, 3, 6000))
    events.wait(ProcessExited("pilot.1", "frag", 0), timeout=120)
    assert "launched frag: 3 rank(s), 3 warm" in stderr.read_text()
    result = json.loads((tmp_path / "frag" / "result.json").read_text())
    assert result["status"] == "done" and result["samples"] == 6000 and result["world"] == 3
    (start,) = [
        r for r in read_reports(tmp_path / "frag" / "progress.jsonl") if r["event"] == "start"
    ]
    assert start["world"] == 3
    assert not any(alive(pid) for pid in standbys)  # one job per standby: they exited

    # The pool replaces what the launch took once its ranks have exited (under load they may
    # take long to be ready, so only their start is waited for); shutdown ends them too.
    until(lambda: len(_standbys_of(proc.pid)) == 3, 120, "the standbys were not replaced")
    replacements = _standbys_of(proc.pid)
    server.send("pilot.1", {"op": "shutdown"})
    events.wait(PilotGone("pilot.1", "bye"))
    assert proc.wait(20) == 0
    until(lambda: not any(alive(pid) for pid in replacements), 10, "a standby outlived its agent")


def test_a_killed_rank_ends_its_whole_launch(serve, agent, tmp_path: Path, mode: str) -> None:
    server, events, proc, stderr = _pilot_up(serve, agent, tmp_path)
    server.send("pilot.1", {"op": "warm_ranks", "size": 2, "mpiexec": MPIEXEC})
    until(lambda: len(_ready_pids(stderr)) == 2, 120, "the standbys never became ready")
    first, second = _ready_pids(stderr)
    server.send("pilot.1", _ranks_launch("frag", tmp_path, 2, 50_000_000))
    progress = tmp_path / "frag" / "progress.jsonl"
    until(lambda: progress.exists() and "start" in progress.read_text(), 120, "no first step")
    os.kill(second, signal.SIGKILL)  # a crashed rank
    until(lambda: events.of(ProcessExited), 60, "the launch's exit was not reported")
    (exited,) = events.of(ProcessExited)
    assert exited.key == "frag" and exited.code != 0
    until(lambda: not alive(first), 10, "the surviving rank was left training")
    # Forked ranks too (the host is all that is left of it).
    until(lambda: len(_rank_hosts_of(proc.pid)) <= 1, 10, "a forked rank was left training")


def test_ranks_start_cold_when_no_standby_can_start(serve, agent, tmp_path: Path) -> None:
    server, events, _, stderr = _pilot_up(serve, agent, tmp_path)
    # A launcher that fails at once: the pool gives up after one failed start per slot.
    server.send("pilot.1", {"op": "warm_ranks", "size": 2, "mpiexec": "/bin/false"})
    until(lambda: "standby ranks cannot start here" in stderr.read_text(), 60, "no give-up")
    server.send("pilot.1", _ranks_launch("frag", tmp_path, 2, 2000))
    events.wait(ProcessExited("pilot.1", "frag", 0), timeout=120)
    assert "launched frag: 2 rank(s), 0 warm" in stderr.read_text()
    result = json.loads((tmp_path / "frag" / "result.json").read_text())
    assert result["status"] == "done" and result["samples"] == 2000 and result["world"] == 2


def test_a_rank_launched_while_its_standby_starts_waits_for_it(
    serve, agent, tmp_path: Path, mode: str
) -> None:
    server, events, _, stderr = _pilot_up(serve, agent, tmp_path)
    # As on a pilot that just came up: the launch follows the warm_ranks at once.
    server.send("pilot.1", {"op": "warm_ranks", "size": 1, "mpiexec": MPIEXEC})
    server.send("pilot.1", _ranks_launch("frag", tmp_path, 1, 2000))
    events.wait(ProcessExited("pilot.1", "frag", 0), timeout=120)
    text = stderr.read_text()
    assert "launched frag: 1 rank(s), 1 warm" in text
    assert text.index("launched frag") < text.index("standby rank ready")  # it was starting
    result = json.loads((tmp_path / "frag" / "result.json").read_text())
    assert result["status"] == "done" and result["samples"] == 2000


def test_a_pilot_submitted_for_training_starts_its_standbys_before_it_registers(
    serve, agent, tmp_path: Path, mode: str
) -> None:
    # --warm-ranks: the executor had training to do when it submitted this pilot.
    server, events, _, stderr = _pilot_up(serve, agent, tmp_path, "--warm-ranks", MPIEXEC)
    text = stderr.read_text()
    assert text.index("standby ranks: 2 starting") < text.index("registering with")
    # No warm_ranks was sent: the pool is the agent's own, one standby per node.
    until(lambda: len(_ready_pids(stderr)) == 2, 120, "the standbys never became ready")
    server.send("pilot.1", {"op": "warm_ranks", "size": 2, "mpiexec": MPIEXEC})  # no second pool
    server.send("pilot.1", _ranks_launch("frag", tmp_path, 1, 2000))
    events.wait(ProcessExited("pilot.1", "frag", 0), timeout=120)
    text = stderr.read_text()
    assert "launched frag: 1 rank(s), 1 warm" in text
    assert text.count("standby ranks:") == 1
    result = json.loads((tmp_path / "frag" / "result.json").read_text())
    assert result["status"] == "done" and result["samples"] == 2000


def test_a_taken_standby_is_replaced_once_its_rank_exits_not_while_it_trains(
    serve, agent, tmp_path: Path
) -> None:
    # CPU nodes without forking: a standby's warm-up would slow the rank beside it.
    server, events, proc, stderr = _pilot_up(
        serve, agent, tmp_path, env={environment.FORK_RANKS: "0"}
    )
    server.send("pilot.1", {"op": "warm_ranks", "size": 1, "mpiexec": MPIEXEC})
    until(lambda: len(_ready_pids(stderr)) == 1, 120, "the standby never became ready")
    server.send("pilot.1", _ranks_launch("frag", tmp_path, 1, 50_000_000))
    progress = tmp_path / "frag" / "progress.jsonl"
    until(lambda: progress.exists() and "start" in progress.read_text(), 120, "no first step")
    # A marker process, sent once a niced refill would be due: the agent has served its pool
    # since then by the time it reports the marker's exit.
    time.sleep(REFILL_DELAY_S)
    server.send("pilot.1", launch("marker", ["true"], tmp_path))
    events.wait(ProcessExited("pilot.1", "marker", 0), timeout=60)
    assert "frag" not in {e.key for e in events.of(ProcessExited)}  # still training
    (rank,) = _ready_pids(stderr)  # the standby that became the rank
    assert _standbys_of(proc.pid) == [rank]  # its slot is the rank's: no standby beside it

    server.send("pilot.1", {"op": "signal", "key": "frag", "signal": "TERM"})
    until(lambda: "frag" in {e.key for e in events.of(ProcessExited)}, 60, "frag never exited")
    until(lambda: _standbys_of(proc.pid) not in ([], [rank]), 60, "the slot got no standby")
    until(lambda: len(_ready_pids(stderr)) == 2, 120, "the replacement never became ready")


def test_a_pool_that_refills_while_busy_replaces_a_taken_standby_niced() -> None:
    # As on a GPU node: the replacement warms up beside the rank, at niceness 19.
    pool = RankPool(1, MPIEXEC, refill_while_busy=True)
    try:
        pool.fill()
        until(lambda: pool.serve(busy=0) or any(s.ready for s in pool.standbys.values()), 120,
              "the standby never became ready")  # fmt: skip
        (first,) = pool.standbys.values()
        job = {"argv": ["--help"], "env": {}, "cwd": None, "stdout": None, "stderr": None}
        taken = pool.take(json.dumps(job).encode() + b"\n")
        assert taken is first and not pool.standbys
        until(lambda: pool.serve(busy=1) or pool.standbys, 30, "no replacement while busy")
        (replacement,) = pool.standbys.values()
        assert replacement.nice and replacement is not first
        assert taken.proc.wait(60) == 0  # the job (the worker's --help) ran on the standby
    finally:
        pool.close()


def test_a_relay_taken_while_starting_is_replaced_only_once_it_is_ready() -> None:
    # A relay holds a job step of its pilot from its start (under Slurm, a CPU of its node).
    # Replaced at once, its replacement could take the last step and keep it, idle, while the
    # taken relay and the fragment's rank waited for it: seen on the loopback cluster's
    # one-CPU nodes, where a fragment launched just after its pilot came up never started.
    pool = RankPool(1, MPIEXEC, fork=True)
    try:
        assert pool.host is not None
        pool.fill()
        (first,) = pool.standbys.values()
        job = {"argv": ["--help"], "env": {}, "cwd": None, "stdout": None, "stderr": None}
        # Taken before any serve: before the pool can have seen it ready.
        assert pool.take(json.dumps(job).encode() + b"\n") is first and first.job is not None

        def handed() -> bool:
            pool.serve()
            if first.job is not None:  # still starting: it alone fills the slot
                assert list(pool.standbys.values()) == [first]
            return first.job is None

        until(handed, 120, "the taken relay never became ready")
        until(lambda: pool.serve() or pool.standbys, 30, "not replaced once it was ready")
        (replacement,) = pool.standbys.values()
        assert replacement is not first and replacement.relay
    finally:
        pool.close()


def _forked(stderr: Path) -> bool:
    return "rank host started" in (stderr.read_text() if stderr.exists() else "")


def test_a_forked_rank_checkpoints_on_term_while_its_slot_is_refilled(
    serve, agent, tmp_path: Path
) -> None:
    server, events, proc, stderr = _pilot_up(serve, agent, tmp_path)
    server.send("pilot.1", {"op": "warm_ranks", "size": 1, "mpiexec": MPIEXEC})
    until(lambda: len(_ready_pids(stderr)) == 1, 120, "the relay never became ready")
    assert _forked(stderr)
    server.send("pilot.1", _ranks_launch("frag", tmp_path, 1, 50_000_000))
    progress = tmp_path / "frag" / "progress.jsonl"
    until(lambda: progress.exists() and "start" in progress.read_text(), 120, "no first step")
    (host, rank) = sorted(_rank_hosts_of(proc.pid))  # the rank: forked after the host
    # A relay costs no warm-up: its slot is refilled while the rank trains.
    until(lambda: len(_ready_pids(stderr)) == 2, 120, "the relay was not replaced")
    # The preemption's TERM reaches the forked rank through its relay: it checkpoints, and
    # its code is mpiexec's.
    server.send("pilot.1", {"op": "signal", "key": "frag", "signal": "TERM"})
    events.wait(ProcessExited("pilot.1", "frag", 0), timeout=60)
    result = json.loads((tmp_path / "frag" / "result.json").read_text())
    assert result["status"] == "stopped" and result["samples"] > 0
    assert Path(result["checkpoint"]).exists()
    until(lambda: not alive(rank), 10, "the forked rank outlived its relay")
    assert alive(host)
    server.send("pilot.1", {"op": "shutdown"})
    events.wait(PilotGone("pilot.1", "bye"))
    assert proc.wait(20) == 0
    until(lambda: not alive(host), 10, "the rank host outlived its agent")


def test_a_dead_rank_host_is_replaced_and_its_ranks_train_on(serve, agent, tmp_path: Path) -> None:
    server, events, proc, stderr = _pilot_up(serve, agent, tmp_path)
    server.send("pilot.1", {"op": "warm_ranks", "size": 1, "mpiexec": MPIEXEC})
    server.send("pilot.1", _ranks_launch("frag", tmp_path, 1, 50_000_000))
    progress = tmp_path / "frag" / "progress.jsonl"
    until(lambda: progress.exists() and "start" in progress.read_text(), 120, "no first step")
    (host, rank) = sorted(_rank_hosts_of(proc.pid))
    os.kill(host, signal.SIGKILL)
    until(lambda: stderr.read_text().count("rank host started") == 2, 60, "no new rank host")
    assert alive(rank)  # the rank is its relay's job, not the host's
    server.send("pilot.1", {"op": "signal", "key": "frag", "signal": "TERM"})
    events.wait(ProcessExited("pilot.1", "frag", 0), timeout=60)
    assert json.loads((tmp_path / "frag" / "result.json").read_text())["status"] == "stopped"
    # The new host forks the next fragment's rank.
    server.send("pilot.1", _ranks_launch("next", tmp_path, 1, 2000))
    events.wait(ProcessExited("pilot.1", "next", 0), timeout=120)
    assert "launched next: 1 rank(s), 1 warm" in stderr.read_text()
    assert json.loads((tmp_path / "next" / "result.json").read_text())["samples"] == 2000


def test_a_launcher_that_gives_no_pmi_port_gets_standbys(serve, agent, tmp_path: Path) -> None:
    # An mpiexec that ignores -pmi-port (its job gets PMI_FD, which a fork cannot share).
    launcher = tmp_path / "mpiexec"
    launcher.write_text(f'#!/bin/sh\n[ "$1" = -pmi-port ] && shift\nexec {MPIEXEC} "$@"\n')
    launcher.chmod(0o755)
    server, events, _, stderr = _pilot_up(serve, agent, tmp_path)
    server.send("pilot.1", {"op": "warm_ranks", "size": 1, "mpiexec": str(launcher)})
    until(lambda: "ranks cannot be forked here" in stderr.read_text(), 60, "no fallback")
    until(lambda: len(_ready_pids(stderr)) == 1, 120, "no standby became ready")
    server.send("pilot.1", _ranks_launch("frag", tmp_path, 1, 2000))
    events.wait(ProcessExited("pilot.1", "frag", 0), timeout=120)
    assert "launched frag: 1 rank(s), 1 warm" in stderr.read_text()
    assert json.loads((tmp_path / "frag" / "result.json").read_text())["samples"] == 2000
