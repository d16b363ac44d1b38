"""The channel against an adversary on the wire, and the agents of a dead driver.

Real sockets and processes throughout: recorded sessions replayed byte for byte from fresh
sockets, wrong keys, a flood of junk, a sniffer in the middle, a driver killed with SIGKILL.
Assertions are about what happened and in which order, never about how fast.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from parsl_bf.executor.channel import PilotGone, PilotServer, PilotUp, ProcessExited
from parsl_bf.pilot.wire import (
    UNAUTHENTICATED,
    AgentSession,
    Refused,
    ServerSession,
    client_socket,
    curve_keys,
    new_secret,
    read_secret,
    sign,
    verify,
)

from ..waiting import until
from .agents import END, alive, launch, pilot_env

UP = PilotUp("pilot.1", ("n0", "n1"), END, socket.gethostname())


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


class CurveRelay:
    """A man in the middle who holds the secret: it ends CurveZMQ on both sides and records
    the application frames each way, i.e. what a replay attack could at best start from."""

    def __init__(self, secret: bytes, server_url: str) -> None:
        self.ctx = zmq.Context()
        keys = curve_keys(secret)
        self.front = self.ctx.socket(zmq.ROUTER)
        self.front.curve_secretkey, self.front.curve_publickey = (
            keys.server_secret,
            keys.server_public,
        )
        self.front.curve_server = True
        self.url = f"tcp://127.0.0.1:{self.front.bind_to_random_port('tcp://127.0.0.1')}"
        self.back = client_socket(self.ctx, secret)
        self.back.connect(server_url)
        self.up: list[list[bytes]] = []  # agent → server
        self.down: list[list[bytes]] = []  # server → agent
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.back, zmq.POLLIN)
        agent = None
        while not self._stop:
            for sock, _ in poller.poll(100):
                if sock is self.front:
                    agent, *frames = self.front.recv_multipart()
                    with self._lock:
                        self.up.append(frames)
                    self.back.send_multipart(frames)
                else:
                    frames = self.back.recv_multipart()
                    with self._lock:
                        self.down.append(frames)
                    if agent is not None:
                        self.front.send_multipart([agent, *frames])

    def ops(self, secret: bytes, direction: str) -> list[str]:
        with self._lock:
            frames = list(self.up if direction == "up" else self.down)
        return [(verify(secret, f) or {}).get("op", "?") for f in frames]

    def close(self) -> tuple[list[list[bytes]], list[list[bytes]]]:
        self._stop = True
        self._thread.join()
        self.ctx.destroy(linger=0)
        return self.up, self.down


class TcpTap:
    """A byte relay between agents and the server, keeping every byte either way."""

    def __init__(self, server_url: str) -> None:
        host, port = server_url.removeprefix("tcp://").rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.captured = bytearray()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with src, dst:
            while True:
                try:
                    data = src.recv(65536)
                    if not data:
                        return
                    with self._lock:
                        self.captured += data
                    dst.sendall(data)
                except OSError:
                    return

    def bytes(self) -> bytes:
        with self._lock:
            return bytes(self.captured)

    def close(self) -> None:
        self.listener.close()


def _replay(server: PilotServer, sock: zmq.Socket, frames: list[list[bytes]]) -> None:
    """Send ``frames`` byte for byte; return once the server has refused every one of them."""
    before = server.refusals.total
    for f in frames:
        sock.send_multipart(f)
    until(lambda: server.refusals.total >= before + len(frames), 60, "replay not all refused")
    assert server.refusals.total == before + len(frames)


def _record_a_session(serve, agent, secret: bytes, tmp_path: Path, **kw):
    """A real agent's session through a :class:`CurveRelay`: registered, one process launched
    and exited, heartbeats and pings going. Returns (server, events, agent, relay, marker)."""
    server, events = serve(**kw)
    relay = CurveRelay(secret, server.url)
    proc = agent(relay.url)
    until(lambda: UP in events.of(PilotUp), 30, "no PilotUp")
    marker = tmp_path / "ran"
    server.send("pilot.1", launch("job", ["sh", "-c", f"echo ran >> {marker}"], tmp_path))
    until(lambda: ProcessExited("pilot.1", "job", 0) in events.of(ProcessExited), 30)
    until(lambda: relay.ops(secret, "down").count("ping") >= 2, 60, "no pings")
    until(lambda: relay.ops(secret, "up").count("heartbeat") >= 3, 60, "no heartbeats")
    return server, events, proc, relay, marker


def test_a_replayed_capture_registers_nothing_keeps_nothingalive(
    serve, agent, secret_file: Path, tmp_path: Path, ctx: zmq.Context
) -> None:
    secret = read_secret(secret_file)
    server, events, proc, relay, marker = _record_a_session(
        serve, agent, secret, tmp_path, heartbeat_timeout_s=2.0
    )
    proc.kill()
    proc.wait()
    up, down = relay.close()
    assert relay.ops(secret, "up")[0] == "register" and "launch" in relay.ops(secret, "down")
    # Replayed from a fresh socket that holds the transport keys: the agent's messages (its
    # register, heartbeats, exit) and the server's (welcome, launch, pings), over and over
    # while the pilot is live, then after it is gone.
    replayer = client_socket(ctx, secret)
    replayer.connect(server.url)
    deadline = time.monotonic() + 120
    while not events.of(PilotGone):
        assert time.monotonic() < deadline, "the replay kept the pilot alive"
        _replay(server, replayer, up + down)
        time.sleep(0.1)
    assert events.of(PilotGone) == [PilotGone("pilot.1", "missed heartbeats")]
    for _ in range(3):
        _replay(server, replayer, up + down)
    assert events.of(PilotUp) == [UP] and server.pilots == {}
    assert events.of(ProcessExited) == [ProcessExited("pilot.1", "job", 0)]
    assert {"replayed registration", "wrong direction (from 'server')"} <= events.reasons()
    assert any(r.startswith("replayed or stale") for r in events.reasons())
    # Nothing came back to the replayer: no welcome, no launch, no ping, not even a shutdown.
    assert replayer.poll(1000) == 0
    assert marker.read_text() == "ran\n"


def test_an_agent_refuses_a_recorded_welcome_andlaunch(
    serve, agent, secret_file: Path, tmp_path: Path, ctx: zmq.Context
) -> None:
    secret = read_secret(secret_file)
    server, events, proc, relay, marker = _record_a_session(serve, agent, secret, tmp_path)
    server.send("pilot.1", {"op": "shutdown"})
    assert proc.wait(30) == 0
    _, down = relay.close()
    recorded = {(verify(secret, f) or {}).get("op"): f for f in down}
    marker.unlink()
    # A server of our own, with the server's keys, plays the recording to a new agent.
    fake = ctx.socket(zmq.ROUTER)
    keys = curve_keys(secret)
    fake.curve_secretkey, fake.curve_publickey = keys.server_secret, keys.server_public
    fake.curve_server = True
    url = f"tcp://127.0.0.1:{fake.bind_to_random_port('tcp://127.0.0.1')}"
    fresh = agent(url, "pilot.1", "--welcome-timeout-s", "60")
    assert fake.poll(30_000), "no register"
    who, *frames = fake.recv_multipart()
    register = verify(secret, frames)
    assert register is not None and register["op"] == "register"
    for op in ("welcome", "launch", "ping"):
        fake.send_multipart([who, *recorded[op]])
    # Then a genuine welcome for its nonce, and the recorded launch again: another session.
    session = ServerSession(secret, register["nonce"])
    fake.send_multipart([who, *session.welcome({"heartbeat_timeout_s": 10.0})])
    assert fake.poll(30_000), "the welcome was not answered"
    who, *frames = fake.recv_multipart()
    first = verify(secret, frames)
    assert first is not None and session.accept(first) is None and first["op"] == "heartbeat"
    fake.send_multipart([who, *recorded["launch"]])
    fake.send_multipart([who, *session.seal({"op": "shutdown"})])
    assert fresh.wait(30) == 0
    err = (tmp_path / "pilot.1.stderr").read_text()
    assert "refused message from the server: welcome of another session" in err
    assert not marker.exists()  # the recorded launch ran nothing
    assert err.count("launched job") == 1  # the first agent's, in the recorded session


def test_wrong_keys_are_refused_before_they_reach_the_application(
    serve, ctx: zmq.Context, secret_file: Path
) -> None:
    secret, other = read_secret(secret_file), new_secret()
    register = AgentSession(secret).register(
        {"pilot": "intruder", "nodes": ["n0"], "ends_at": None, "host": "h"}
    )
    ours, wrong = curve_keys(secret), curve_keys(other)
    wrong_client = (wrong.client_public, wrong.client_secret)

    def dealer(server_key: bytes | None, client: tuple[bytes, bytes] | None) -> zmq.Socket:
        sock = ctx.socket(zmq.DEALER)
        if server_key is not None and client is not None:
            sock.curve_serverkey = server_key
            sock.curve_publickey, sock.curve_secretkey = client
        return sock

    # One server for each, so that each refusal is surely that client's.
    for sock, frames, peer, reason in (
        (
            dealer(wrong.server_public, wrong_client),  # another run's keys
            register,
            UNAUTHENTICATED,
            "CurveZMQ handshake failed: wrong key",
        ),
        (
            dealer(ours.server_public, wrong_client),  # our server's key, not our client key
            register,
            "127.0.0.1",
            "unknown CurveZMQ client key",
        ),
        (dealer(None, None), register, UNAUTHENTICATED, "CurveZMQ handshake failed"),  # clear
        (
            client_socket(ctx, secret),  # our keys, another secret's signature
            sign(other, {"op": "register"}),
            "127.0.0.1",
            "bad signature",
        ),
    ):
        server, events = serve()
        sock.connect(server.url)
        sock.send_multipart(frames)
        until(lambda: events.of(Refused), 60, f"nothing refused for {reason}")  # noqa: B023
        first = events.of(Refused)[0]
        assert first.peer == peer and first.reason.startswith(reason), first
        assert events.of(PilotUp) == [] and server.pilots == {}
        assert sock.poll(500) == 0  # no welcome, nor anything else
        sock.close(linger=0)
        server.stop()


def test_an_agent_reports_its_nodes_gpus_and_a_bad_count_is_refused(
    serve, agent, ctx: zmq.Context, secret_file: Path
) -> None:
    server, events = serve()
    agent(server.url, env={"CUDA_VISIBLE_DEVICES": "0,1"})  # as Slurm's --gpus=2 sets it
    events.wait(PilotUp("pilot.1", ("n0", "n1"), END, socket.gethostname(), gpus=2))
    secret = read_secret(secret_file)
    for i, gpus in enumerate((-1, 10**6, "2", 1.5, True)):
        sock = client_socket(ctx, secret)
        sock.connect(server.url)
        registration = {"pilot": f"p{i}", "nodes": ["n0"], "ends_at": None, "host": "h"}
        sock.send_multipart(AgentSession(secret).register(registration | {"gpus": gpus}))
        until(lambda: len(events.of(Refused)) > i, 60, f"gpus={gpus!r} not refused")  # noqa: B023
        assert "gpus must be an integer" in events.of(Refused)[i].reason
        assert sock.poll(500) == 0  # no welcome
        sock.close(linger=0)
    assert list(server.pilots) == ["pilot.1"] and server.pilots["pilot.1"].gpus == 2


def _refused_in(record: logging.LogRecord) -> int:
    message = record.getMessage()
    if message.startswith("refused message from "):
        return 1
    match = re.match(r"refused (\d+) messages: ", message)
    assert match, message
    return int(match[1])


def test_a_flood_of_junk_is_counted_in_few_lines_and_events(
    serve, agent, ctx: zmq.Context, secret_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="parsl_bf.executor.channel")
    server, events = serve()
    live = agent(server.url)
    until(lambda: UP in events.of(PilotUp), 30, "no PilotUp")
    flood = 20_000
    junk = client_socket(ctx, read_secret(secret_file))  # past the transport: a buggy peer
    junk.connect(server.url)
    for i in range(flood):
        junk.send_multipart([b"junk", str(i).encode()])
    until(lambda: sum(e.count for e in events.of(Refused)) >= flood, 300, "junk not all counted")
    lines = [
        r
        for r in caplog.records
        if r.name == "parsl_bf.executor.channel" and r.getMessage().startswith("refused")
    ]
    # Every junk frame counted once, in lines the server writes at least 1 s apart: n lines
    # span n - 1 s or more, however long the flood took (with 5 s of slack for a stall
    # between the server reading its clock and the record taking the time).
    assert sum(_refused_in(r) for r in lines) == flood
    assert len(lines) <= 1 + (lines[-1].created - lines[0].created) + 5
    assert 100 * len(lines) < flood
    # The same for the events the executor logs: at most one per peer and reason a second,
    # the first at once.
    refused = events.timed(Refused)
    assert sum(e.count for _, e in refused) == flood
    assert refused[0][1] == Refused("127.0.0.1", "bad signature", 1)
    assert {e.peer for _, e in refused} == {"127.0.0.1"}
    assert len(refused) <= 1 + (refused[-1][0] - refused[0][0]) + 5
    assert 100 * len(refused) < flood
    # Meanwhile the live pilot's heartbeats and the server's pings went on.
    assert events.of(PilotGone) == [] and list(server.pilots) == ["pilot.1"]
    assert live.poll() is None


def test_a_sniffer_in_the_middle_sees_no_argv_or_environment(
    serve, agent, tmp_path: Path, secret_file: Path
) -> None:
    server, events = serve()
    tap = TcpTap(server.url)
    try:
        agent(tap.url)
        until(lambda: UP in events.of(PilotUp), 30, "no PilotUp")
        argv_marker, env_marker = f"argv-{secrets.token_hex(8)}", f"env-{secrets.token_hex(8)}"
        cmd = f'echo {argv_marker} "$PARSL_BF_TEST_TOKEN"'
        server.send(
            "pilot.1",
            launch("job", ["sh", "-c", cmd], tmp_path, env={"PARSL_BF_TEST_TOKEN": env_marker}),
        )
        until(lambda: events.of(ProcessExited), 30, "no exit")
        assert (tmp_path / "job.out").read_text() == f"{argv_marker} {env_marker}\n"
        server.send("pilot.1", {"op": "shutdown"})
        until(lambda: events.of(PilotGone), 30, "no bye")
        wire = tap.bytes()
    finally:
        tap.close()
    assert len(wire) > 1000  # the session went through the tap
    secret = read_secret(secret_file)
    for clear in (argv_marker, env_marker, "launch", '"op"', "pilot.1", "heartbeat"):
        assert clear.encode() not in wire, clear
    assert secret not in wire and curve_keys(secret).client_secret not in wire


DRIVER = """
import json, os, queue, sys, time
from parsl_bf.executor.channel import PilotServer, PilotUp
from parsl_bf.pilot.wire import read_secret

secret_file, url_file, launches = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
events = queue.Queue()
server = PilotServer(read_secret(secret_file), events.put)
server.start()
with open(url_file + ".tmp", "w") as f:
    f.write(server.url)
os.rename(url_file + ".tmp", url_file)
while not isinstance(events.get(), PilotUp):
    pass
for msg in launches:
    server.send("pilot.1", msg)
while True:
    time.sleep(60)
"""


def _pids(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text else None


def test_a_killed_driver_leaves_no_agent_or_rank_alive(
    agent, secret_file: Path, tmp_path: Path
) -> None:
    d = tmp_path
    ranks = {
        # Checkpoints (here: notes the signal) and leaves on SIGTERM; its child dies with it.
        "rank0": f"trap 'echo TERM >> {d}/rank0.log; exit 0' TERM; sleep 300 & "
        f"echo $! > {d}/rank0.child; echo $$ > {d}/rank0.pid; "
        f"while :; do echo step >> {d}/rank0.steps; sleep 0.1; done",
        # Ignores SIGTERM, and so does its child: only SIGKILL ends them.
        "rank1": f"trap '' TERM; sleep 300 & echo $! > {d}/rank1.child; echo $$ > {d}/rank1.pid; "
        "while :; do sleep 0.1; done",
    }
    launches = [launch(key, ["sh", "-c", script], d) for key, script in ranks.items()]
    files = [d / f"{key}.{kind}" for key in ranks for kind in ("pid", "child")]
    url_file = d / "url"
    with open(d / "driver.stderr", "w") as err:
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, str(secret_file), str(url_file), json.dumps(launches)],
            env=pilot_env("driver"),
            stderr=err,
        )
    try:
        until(url_file.exists, 60, "the driver did not start")
        proc = agent(url_file.read_text())
        until(lambda: all(_pids(f) for f in files), 60, "the ranks did not start")
        pids = [proc.pid, *(_pids(f) for f in files)]
        assert all(alive(p) for p in pids)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        until(lambda: proc.poll() is not None and not any(alive(p) for p in pids), 120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for f in files:  # whatever is left of the ranks, should the test fail
            pid = _pids(f)
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 4
    err = (d / "pilot.1.stderr").read_text()
    silent = err.index("driver silent")
    assert (
        silent
        < err.index("SIGKILL to 1 process group(s) left")
        < err.index("exiting: the driver is silent")
    )
    assert (d / "rank0.log").read_text() == "TERM\n"  # it got the SIGTERM, then the grace
    assert "rank1 exited with -9" in err and "rank0 exited with 0" in err
