"""Pilot agents as real processes on a real ZeroMQ channel; the plain-app runner."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
from parsl.serialize import pack_apply_message

from parsl_bf.executor.channel import PilotGone, PilotPreempted, PilotUp, ProcessExited
from parsl_bf.pilot.outcome import MODULE, RunnerError, UnpicklableError, command, read_outcome
from parsl_bf.pilot.wire import UNAUTHENTICATED, Refused, write_secret

from ..waiting import until
from .agents import END, alive, launch, pilot_env


def test_agent_registers_runs_processes_and_shuts_down(serve, agent, tmp_path: Path) -> None:
    server, events = serve()
    proc = agent(server.url)
    events.wait(PilotUp("pilot.1", ("n0", "n1"), END, socket.gethostname()))
    assert list(server.pilots) == ["pilot.1"]

    cmd = "echo $GREETING; pwd; exit 3"
    msg = launch("three", ["sh", "-c", cmd], tmp_path, env={"GREETING": "hi"}, cwd=str(tmp_path))
    server.send("pilot.1", msg)
    events.wait(ProcessExited("pilot.1", "three", 3))
    assert (tmp_path / "three.out").read_text() == f"hi\n{tmp_path}\n"

    server.send("pilot.1", launch("sleeper", ["sleep", "30"], tmp_path))
    until(lambda: (tmp_path / "sleeper.out").exists())  # the agent opened it: sleep has started
    server.send("pilot.1", {"op": "signal", "key": "sleeper", "signal": "TERM"})
    events.wait(ProcessExited("pilot.1", "sleeper", -signal.SIGTERM))

    server.send("pilot.1", launch("missing", ["/nonexistent/program"], tmp_path))
    events.wait(ProcessExited("pilot.1", "missing", 127))
    assert "launch failed" in (tmp_path / "missing.err").read_text()

    server.send("pilot.1", {"op": "shutdown"})
    events.wait(PilotGone("pilot.1", "bye"))
    assert proc.wait(30) == 0  # a hang guard, not a speed bound
    assert server.pilots == {} and events.of(Refused) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_to_the_agent_is_a_preemption(serve, agent, tmp_path: Path, sig) -> None:
    server, events = serve()
    proc = agent(server.url)
    events.wait(PilotUp("pilot.1", ("n0", "n1"), END, socket.gethostname()))
    log, ready = tmp_path / "rank.log", tmp_path / "rank.ready"
    # A training rank: checkpoints (here: notes the signal) and exits 0 on SIGTERM.
    rank = f"trap 'echo TERM >> {log}; exit 0' TERM; touch {ready}; while :; do sleep 0.05; done"
    server.send("pilot.1", launch("rank", ["sh", "-c", rank], tmp_path))
    until(ready.exists)
    sent = time.time()
    proc.send_signal(sig)
    gone = events.wait(PilotGone("pilot.1", "bye"))
    assert proc.wait(30) == 0  # a hang guard, not a speed bound
    [preempted] = events.of(PilotPreempted)
    assert preempted.signal == sig.name.removeprefix("SIG")
    assert sent - 1 <= preempted.at <= time.time()
    exited = events.items.index(ProcessExited("pilot.1", "rank", 0))
    assert events.items.index(preempted) < exited < gone
    assert log.read_text() == "TERM\n"


def test_an_agent_with_the_wrong_secret_is_refused(
    serve, agent, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="parsl_bf.executor.channel")
    server, events = serve()
    wrong = tmp_path / "wrong"
    write_secret(wrong)
    proc = agent(server.url, "pilot.1", "--welcome-timeout-s", "1", secret=wrong)
    assert proc.wait(20) == 3
    assert "no welcome" in (tmp_path / "pilot.1.stderr").read_text()
    # Its keys, derived from the wrong secret, fail the CurveZMQ handshake: no frame of it
    # reaches the server's application, and each retry is counted, not logged.
    until(lambda: events.of(Refused))
    refused = events.of(Refused)[0]
    assert refused == Refused(UNAUTHENTICATED, "CurveZMQ handshake failed: wrong key", 1)
    assert {(r.peer, r.reason) for r in events.of(Refused)} == {(refused.peer, refused.reason)}
    assert events.of(PilotUp) == [] and server.pilots == {}
    [first, *_] = [r for r in caplog.records if r.name == "parsl_bf.executor.channel"]
    assert first.getMessage() == (
        f"refused message from {UNAUTHENTICATED}: CurveZMQ handshake failed: wrong key"
    )


@pytest.mark.slow
def test_a_killed_agent_misses_its_heartbeats(serve, agent) -> None:
    server, events = serve(heartbeat_timeout_s=1.0)
    proc = agent(server.url)
    events.wait(PilotUp("pilot.1", ("n0", "n1"), END, socket.gethostname()))
    time.sleep(1.5)  # a live agent outlasts the timeout
    assert events.of(PilotGone) == [] and list(server.pilots) == ["pilot.1"]
    proc.kill()
    killed = time.monotonic()
    events.wait(PilotGone("pilot.1", "missed heartbeats"), timeout=5)
    # The timeout, plus up to one check interval of the server's loop.
    assert time.monotonic() - killed < 1.0 + 0.5 + 0.5
    assert server.pilots == {}


@pytest.mark.slow
def test_an_agent_leaves_when_the_executor_disappears(serve, agent, tmp_path: Path) -> None:
    server, events = serve(heartbeat_timeout_s=1.0)
    proc = agent(server.url)
    events.wait(PilotUp("pilot.1", ("n0", "n1"), END, socket.gethostname()))
    pid = tmp_path / "sleeper.pid"
    server.send(
        "pilot.1", launch("sleeper", ["sh", "-c", f"echo $$ > {pid}; exec sleep 60"], tmp_path)
    )
    until(lambda: pid.exists() and pid.read_text().strip())
    server.stop()
    # Silent for the window the welcome gave (8 s): the agent TERMs its processes and exits 4.
    assert proc.wait(30) == 4
    log = (tmp_path / "pilot.1.stderr").read_text()
    assert log.index("driver silent") < log.index("exiting: the driver is silent")
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid.read_text()), 0)


@pytest.mark.slow
def test_shutdown_kills_what_ignores_sigterm(serve, agent, tmp_path: Path) -> None:
    server, events = serve()
    proc = agent(server.url)
    events.wait(PilotUp("pilot.1", ("n0", "n1"), END, socket.gethostname()))
    ready = tmp_path / "ready"
    stubborn = f"trap '' TERM; touch {ready}; while :; do sleep 0.05; done"
    server.send("pilot.1", launch("stubborn", ["sh", "-c", stubborn], tmp_path))
    until(ready.exists)
    asked = time.monotonic()
    server.send("pilot.1", {"op": "shutdown"})
    events.wait(ProcessExited("pilot.1", "stubborn", -signal.SIGKILL), timeout=20)
    assert time.monotonic() - asked >= 9.5  # the 10 s grace after the SIGTERM
    events.wait(PilotGone("pilot.1", "bye"))
    assert proc.wait(30) == 0  # a hang guard, not a speed bound


# --- the plain-app runner -------------------------------------------------------------------


class Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("not today")


def divide(a: float, b: float) -> float:
    return a / b


def raise_unpicklable() -> None:
    raise Unpicklable("held a lock")


def _run(tmp_path: Path, payload: bytes) -> tuple[int, Path]:
    src, out = tmp_path / "app.in", tmp_path / "app.out"
    src.write_bytes(payload)
    done = subprocess.run(
        [sys.executable, "-m", MODULE, str(src), str(out)],
        env=pilot_env("runner"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 or "parsl-bf runner" in done.stderr
    return done.returncode, out


def test_runner_returns_a_value_or_the_exception(tmp_path: Path) -> None:
    code, out = _run(tmp_path, pack_apply_message(lambda x, y=1: x * y, (6,), {"y": 7}))
    assert code == 0 and read_outcome(out) == (True, 42)
    code, out = _run(tmp_path, pack_apply_message(divide, (1, 0), {}))
    ok, exc = read_outcome(out)
    assert code == 0 and not ok and isinstance(exc, ZeroDivisionError)
    assert "divide" in "".join(traceback.format_tb(exc.__traceback__))  # the remote traceback
    assert [p.name for p in tmp_path.iterdir()] == ["app.in", "app.out"]  # no temporary left


def test_runner_reports_what_cannot_travel_and_bad_input(tmp_path: Path) -> None:
    code, out = _run(tmp_path, pack_apply_message(raise_unpicklable, (), {}))
    ok, exc = read_outcome(out)
    assert code == 0 and not ok and isinstance(exc, UnpicklableError)
    assert "Unpicklable: held a lock" in str(exc)
    code, out = _run(tmp_path, b"not a packed app")
    ok, exc = read_outcome(out)
    assert code == 2 and not ok and isinstance(exc, RunnerError)
    assert subprocess.run([sys.executable, "-m", MODULE], env=pilot_env("r")).returncode == 2


# --- plain apps forked from the warm host ---------------------------------------------------


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def who_am_i(note: str) -> dict:
    """A plain app: where it runs, what it sees; it also writes to stdout, stderr and ``note``."""
    print("to stdout")
    print("to stderr", file=sys.stderr)
    Path(note).write_text(os.environ["GREETING"])  # relative: in the workflow's cwd
    return {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "sid": os.getsid(0)}


def sleep_noting(ready: str) -> None:
    """A plain app that notes its parent (the warm host) and sleeps."""
    Path(ready).write_text(str(os.getppid()))
    time.sleep(60)


def leave_behind(flag: str) -> dict:
    """A plain app that changes what a process may change and starts a child it never waits
    for, in its own process group."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    os.environ["LEFT_BY_THE_LAST_APP"] = flag
    os.chdir("/")
    return {"pid": os.getpid(), "child": child.pid}


def what_is_left() -> dict:
    return {
        "pid": os.getpid(),
        "env": os.environ.get("LEFT_BY_THE_LAST_APP"),
        "cwd": os.getcwd(),
    }


def _plain(key: str, tmp_path: Path, func, *args, **kw) -> tuple[dict, Path]:
    src, out = tmp_path / f"{key}.in", tmp_path / f"{key}.app.out"
    src.write_bytes(pack_apply_message(func, args, {}))
    return {**launch(key, command(src, out), tmp_path, **kw), "warm": True}, out


@pytest.fixture
def warm_agent(serve, agent):
    server, events = serve()
    proc = agent(server.url)
    events.wait(PilotUp("pilot.1", ("n0", "n1"), END, socket.gethostname()))
    return server, events, proc


def test_a_plain_app_runs_forked_from_the_warm_host(warm_agent, tmp_path: Path) -> None:
    server, events, proc = warm_agent
    work = tmp_path / "work"
    work.mkdir()
    msg, out = _plain("app", tmp_path, who_am_i, "note", env={"GREETING": "hi"}, cwd=str(work))
    server.send("pilot.1", msg)
    events.wait(ProcessExited("pilot.1", "app", 0))
    ok, seen = read_outcome(out)
    assert ok and (work / "note").read_text() == "hi"
    assert (tmp_path / "app.out").read_text() == "to stdout\n"
    assert (tmp_path / "app.err").read_text() == "to stderr\n"
    # Forked by the host (the agent's child), in a session and group of its own.
    assert seen["ppid"] != proc.pid and _ppid(seen["ppid"]) == proc.pid
    assert seen["pid"] == seen["pgid"] == seen["sid"]
    # A second app comes from the same host: no process started per app.
    msg, out = _plain("again", tmp_path, who_am_i, "note", env={"GREETING": "ho"}, cwd=str(work))
    server.send("pilot.1", msg)
    events.wait(ProcessExited("pilot.1", "again", 0))
    assert read_outcome(out)[1]["ppid"] == seen["ppid"]

    # A TERM to its key ends it; `exited` says so.
    ready = tmp_path / "ready"
    server.send("pilot.1", _plain("sleeper", tmp_path, sleep_noting, str(ready))[0])
    until(lambda: ready.exists() and ready.read_text())
    server.send("pilot.1", {"op": "signal", "key": "sleeper", "signal": "TERM"})
    events.wait(ProcessExited("pilot.1", "sleeper", -signal.SIGTERM))

    server.send("pilot.1", {"op": "shutdown"})
    events.wait(PilotGone("pilot.1", "bye"))
    assert proc.wait(30) == 0  # a hang guard, not a speed bound
    assert not alive(seen["ppid"])  # no host outlives its agent


def test_the_next_app_runs_in_the_same_worker_with_nothing_left(warm_agent, tmp_path: Path) -> None:
    """A worker of the warm host runs app after app (no fork per app), and each starts as
    in a fresh process: the last app's environment, cwd and subprocesses are gone."""
    server, events, _ = warm_agent
    msg, out = _plain("first", tmp_path, leave_behind, "yes", cwd=str(tmp_path))
    server.send("pilot.1", msg)
    events.wait(ProcessExited("pilot.1", "first", 0))
    first = read_outcome(out)[1]
    until(lambda: not alive(first["child"]), 30, "the app's subprocess outlived it")
    msg, out = _plain("second", tmp_path, what_is_left, cwd=str(tmp_path))
    server.send("pilot.1", msg)
    events.wait(ProcessExited("pilot.1", "second", 0))
    second = read_outcome(out)[1]
    assert second == {"pid": first["pid"], "env": None, "cwd": str(tmp_path)}


def test_a_killed_warm_host_is_replaced_and_its_app_lost(warm_agent, tmp_path: Path) -> None:
    server, events, proc = warm_agent
    ready = tmp_path / "ready"
    server.send("pilot.1", _plain("sleeper", tmp_path, sleep_noting, str(ready))[0])
    until(lambda: ready.exists() and ready.read_text())
    host = int(ready.read_text())
    os.kill(host, signal.SIGKILL)
    events.wait(ProcessExited("pilot.1", "sleeper", -signal.SIGKILL))  # lost with its host
    msg, out = _plain(
        "after", tmp_path, who_am_i, "note", env={"GREETING": "hi"}, cwd=str(tmp_path)
    )
    server.send("pilot.1", msg)
    events.wait(ProcessExited("pilot.1", "after", 0))
    new_host = read_outcome(out)[1]["ppid"]
    assert new_host != host and _ppid(new_host) == proc.pid  # a new host, the agent's child
    # The agent killed outright: the kernel takes its host with it.
    proc.kill()
    proc.wait()
    until(lambda: not alive(new_host), 10, "the warm host outlived its agent")


def test_a_warm_launch_that_cannot_start_is_reported(warm_agent, tmp_path: Path) -> None:
    server, events, _ = warm_agent
    msg, _ = _plain("nowhere", tmp_path, who_am_i, "note", cwd=str(tmp_path / "missing"))
    server.send("pilot.1", msg)
    events.wait(ProcessExited("pilot.1", "nowhere", 127))
    assert "launch failed" in (tmp_path / "nowhere.err").read_text()
