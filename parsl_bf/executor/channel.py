"""The executor's end of the channel to its pilot agents: :class:`PilotServer`, a CurveZMQ
ROUTER socket served by one thread, and the events it reports (:data:`Event`).

The protocol, its messages and its threat model are :mod:`parsl_bf.pilot.wire`'s, the contract
this server and the agents (:mod:`parsl_bf.pilot.agent`) share.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from ..pilot.wire import (
    MAX_GPUS,
    SILENCE_S,
    UNAUTHENTICATED,
    Op,
    RefusalLog,
    Refused,
    ServerSession,
    curve_keys,
    is_nonce,
    session_of,
    verify,
)

__all__ = [
    "Event",
    "PilotGone",
    "PilotPreempted",
    "PilotServer",
    "PilotUp",
    "ProcessExited",
]

log = logging.getLogger(__name__)

#: Messages the server reads before it looks at its pings and heartbeats again.
MAX_BATCH = 500
#: Registrations waiting for the agent's first message in the session, at most.
MAX_PENDING = 4096
ZAP_ENDPOINT = "inproc://zeromq.zap.01"


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PilotUp:
    """A pilot's agent registered: its nodes, its walltime end (epoch seconds), host, and the
    GPUs of each of its nodes (0: CPU nodes)."""

    pilot: str
    nodes: tuple[str, ...]
    ends_at: float | None
    host: str
    gpus: int = 0


@dataclass(frozen=True)
class PilotPreempted:
    """The pilot's agent got a preemption signal (``"TERM"``, ``"USR1"``; ``"PARENT"`` when
    the pilot job's script left under it) at ``at`` (epoch seconds); its grace time runs.
    Its processes got SIGTERM; their exits follow, then :class:`PilotGone`."""

    pilot: str
    signal: str
    at: float


@dataclass(frozen=True)
class PilotGone:
    """The pilot's agent said ``"bye"``, or was silent for the heartbeat timeout
    (``reason="missed heartbeats"``): processes not reported exited are lost with it."""

    pilot: str
    reason: str


@dataclass(frozen=True)
class ProcessExited:
    """A launched process ended: its return code, negative for the signal that killed it."""

    pilot: str
    key: str
    code: int


Event = PilotUp | PilotPreempted | PilotGone | ProcessExited | Refused


# --- the executor's end ---------------------------------------------------------------------


@dataclass
class _Peer:
    wire: ServerSession
    up: PilotUp
    identity: bytes  # the route to its agent: the connection its last message came on
    started: float  # time.monotonic() of the register
    last_seen: float
    state: str = "pending"  # "pending" (welcomed) → "live" (PilotUp) → "gone"
    told_to_leave: bool = False


_HANDSHAKE_ERRORS = {
    zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: "wrong key",
    zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: "not CurveZMQ",
}


class PilotServer:
    """The executor's end of the channel: a CurveZMQ ROUTER socket that pilot agents connect
    to, served by one thread (which also pings them and answers ZAP requests).

    ``on_event`` receives the :data:`Event` objects, called from the server's thread: it should
    only record or enqueue them. :meth:`send` may be called from any thread. ``silence_s`` is
    how long an agent may hear nothing before it stops its processes and leaves (sent in the
    welcome); ``refusal_interval_s``: at most one refusal line and event per peer and reason
    that often.
    """

    def __init__(
        self,
        secret: bytes,
        on_event: Callable[[object], None],
        address: str = "127.0.0.1",
        heartbeat_timeout_s: float = 10.0,
        silence_s: float = SILENCE_S,
        refusal_interval_s: float = 1.0,
    ) -> None:
        if heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be positive, not {heartbeat_timeout_s}")
        if silence_s <= 0:
            raise ValueError(f"silence_s must be positive, not {silence_s}")
        self.secret = secret
        self.keys = curve_keys(secret)
        self.on_event = on_event
        self.address = address
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.silence_s = silence_s
        # Several pings in an agent's silence window, and in our heartbeat timeout.
        self.ping_s = min(heartbeat_timeout_s, silence_s) / 4
        self.refusals = RefusalLog(self._emit, log, refusal_interval_s)
        self._url: str | None = None
        self._lock = threading.Lock()
        self._sessions: dict[tuple[str, str], _Peer] = {}  # pending, live and gone
        self._pending: dict[tuple[str, str], _Peer] = {}  # welcomed, not heard from since
        self._peers: dict[str, _Peer] = {}  # live, by pilot
        self._gone: set[str] = set()  # pilots reported gone, never registered again
        self._by_identity: dict[bytes, _Peer] = {}
        self._nonces: set[str] = set()  # agent nonces of every registration accepted
        self._outbox: deque[tuple[str, dict[str, Any]]] = deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._zap: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._wake_r = self._wake_w = -1

    # --- public API -------------------------------------------------------------------------

    def start(self) -> None:
        """Bind to a random port on ``address`` and serve from a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("PilotServer already started")
        if not zmq.has("curve"):
            raise RuntimeError(f"libzmq {zmq.zmq_version()} has no CurveZMQ: cannot encrypt")
        self._ctx = zmq.Context()
        # Client authentication: libzmq asks this socket about every CurveZMQ client.
        self._zap = self._ctx.socket(zmq.REP)
        self._zap.bind(ZAP_ENDPOINT)
        sock = self._ctx.socket(zmq.ROUTER)
        sock.curve_secretkey = self.keys.server_secret
        sock.curve_publickey = self.keys.server_public
        sock.curve_server = True
        sock.zap_domain = b"parsl-bf"
        # Raise on a send to a peer that has disconnected, instead of dropping it silently.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._monitor = sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        )
        port = sock.bind_to_random_port(f"tcp://{self.address}")
        host = socket.gethostname() if self.address in ("*", "0.0.0.0") else self.address
        self._url = f"tcp://{host}:{port}"
        self._sock = sock
        # send() wakes the loop through a pipe: zmq sockets must stay in the server's thread.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._loop, name="parsl-bf-pilots", daemon=True)
        self._thread.start()
        log.info("pilot server listening on %s (CurveZMQ)", self._url)

    @property
    def url(self) -> str:
        """Where agents connect, ``tcp://HOST:PORT`` (after :meth:`start`)."""
        if self._url is None:
            raise RuntimeError("PilotServer not started")
        return self._url

    @property
    def pilots(self) -> dict[str, PilotUp]:
        """The live pilots: registered, and neither said bye nor missed their heartbeats."""
        with self._lock:
            return {pilot: peer.up for pilot, peer in self._peers.items()}

    def send(self, pilot: str, msg: dict[str, Any]) -> None:
        """Queue ``msg`` for ``pilot``'s agent; thread-safe, returns at once.

        A message for a pilot that is not live when the server's thread gets to it is dropped
        with a warning: the pilot's :class:`PilotGone` event is (or was) on its way.
        """
        if "op" not in msg:
            raise ValueError(f"message without an op: {msg!r}")
        with self._lock:
            self._outbox.append((pilot, msg))
        self._wake()

    def stop(self) -> None:
        """Send what is queued, stop the thread, close the socket. Agents are left running:
        send them ``shutdown`` first to end them."""
        if self._thread is None:
            return
        self._stopping = True
        self._wake()
        self._thread.join()
        self._thread = None
        assert self._sock is not None and self._ctx is not None
        assert self._zap is not None and self._monitor is not None
        self.refusals.flush(force=True)
        self._sock.disable_monitor()
        self._monitor.close(linger=0)
        self._sock.close(linger=1000)  # let the last commands (a shutdown) reach the agents
        self._zap.close(linger=0)
        self._ctx.term()
        os.close(self._wake_r)
        os.close(self._wake_w)
        log.info("pilot server on %s stopped", self._url)

    # --- the server's thread ----------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full pipe: a wake-up is pending
            os.write(self._wake_w, b"x")

    def _loop(self) -> None:
        assert self._sock is not None and self._zap is not None and self._monitor is not None
        poller = zmq.Poller()
        for s in (self._sock, self._zap, self._monitor, self._wake_r):
            poller.register(s, zmq.POLLIN)
        next_ping = time.monotonic() + self.ping_s
        while not self._stopping:
            try:
                ready = dict(poller.poll(timeout=min(self.ping_s, 0.5) * 1000))
                if self._wake_r in ready:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                if self._zap in ready:
                    self._answer_zap()
                if self._monitor in ready:
                    self._read_monitor()
                if self._sock in ready:
                    self._receive_some()
                self._flush()
                now = time.monotonic()
                if now >= next_ping:
                    with self._lock:
                        live = list(self._peers.values())
                    for peer in live:
                        self._send_to(peer, {"op": Op.PING})
                    next_ping = now + self.ping_s
                self._check_heartbeats(now)
                self.refusals.flush()
            except Exception:  # keep serving: one bad message must not cut off every pilot
                log.exception("pilot server loop failed; continuing")
        self._flush()

    def _emit(self, event: object) -> None:
        try:
            self.on_event(event)
        except Exception:
            log.exception("pilot event handler failed on %r", event)

    def _answer_zap(self) -> None:
        assert self._zap is not None
        while True:
            try:
                request = self._zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            # version, request id, domain, address, routing id, mechanism, credentials...
            if len(request) < 6:  # not from libzmq; a REP socket must still answer
                self._zap.send_multipart([b"1.0", b"", b"500", b"bad request", b"", b""])
                continue
            request_id, address, mechanism = request[1], request[3], request[5]
            key = request[6] if len(request) > 6 else b""
            ok = mechanism == b"CURVE" and hmac.compare_digest(
                key, z85.decode(self.keys.client_public)
            )
            status = [b"200", b"OK", b"agent"] if ok else [b"400", b"unknown client key", b""]
            self._zap.send_multipart([b"1.0", request_id, *status, b""])
            if not ok:
                self.refusals.add(address.decode(errors="replace"), "unknown CurveZMQ client key")

    def _read_monitor(self) -> None:
        assert self._monitor is not None
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            value = event["value"]
            if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                why = _HANDSHAKE_ERRORS.get(value, f"protocol error {value:#x}")
            else:  # an errno, as a peer that hangs up early leaves
                why = os.strerror(value).lower() if 0 < value < 4096 else f"error {value:#x}"
            self.refusals.add(UNAUTHENTICATED, f"CurveZMQ handshake failed: {why}")

    def _receive_some(self) -> None:
        assert self._sock is not None
        for _ in range(MAX_BATCH):  # then pings and heartbeats get their turn: floods wait
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._receive(frames)
        self._wake()  # more waiting: come back at once

    def _peer_name(self, identity: bytes, frame: zmq.Frame) -> str:
        with self._lock:
            peer = self._by_identity.get(identity)
        if peer is not None:
            return peer.up.pilot
        try:
            return str(frame.get("Peer-Address"))
        except zmq.ZMQError:  # metadata is not available on every transport
            return f"? ({identity.hex()})"

    def _refuse(self, identity: bytes, frame: zmq.Frame, reason: str) -> None:
        self.refusals.add(self._peer_name(identity, frame), reason)

    def _receive(self, frames: list[zmq.Frame]) -> None:
        identity = frames[0].bytes
        msg = verify(self.secret, [f.bytes for f in frames[1:]])
        if msg is None:
            self._refuse(identity, frames[-1], "bad signature")
            return
        op = msg.get("op")
        if op == Op.REGISTER and "session" not in msg:
            self._register(identity, msg, frames[-1])
            return
        sid = session_of(msg)
        with self._lock:
            peer = self._sessions.get(sid) if sid is not None else None
        if peer is None:
            self._refuse(identity, frames[-1], "unknown session" if sid else "no session")
            return
        reason = peer.wire.accept(msg)
        if reason is not None:
            self._refuse(identity, frames[-1], reason)
            return
        now = time.monotonic()
        with self._lock:
            peer.last_seen = now
            if peer.identity != identity:  # the agent reconnected: follow it
                log.info("pilot %s: its agent reconnected", peer.up.pilot)
                self._by_identity.pop(peer.identity, None)
                peer.identity = identity
                self._by_identity[identity] = peer
        if peer.state == "pending":
            self._confirm(peer)
        if peer.state == "gone":
            if op != "bye":
                # One of our agents that we gave up on (it stalled past the heartbeat timeout,
                # or clashed with a live pilot): its processes would duplicate work.
                if not peer.told_to_leave:
                    log.warning(
                        "pilot %s is gone: %r ignored, telling it to shut down", peer.up.pilot, op
                    )
                peer.told_to_leave = True
                self._send_to(peer, {"op": Op.SHUTDOWN})
            return
        self._dispatch(peer.up.pilot, op, msg)

    def _dispatch(self, pilot: str, op: object, msg: dict[str, Any]) -> None:
        try:
            if op == Op.HEARTBEAT:
                pass
            elif op == Op.PREEMPTED:
                log.info("pilot %s: preempted (SIG%s)", pilot, msg["signal"])
                self._emit(PilotPreempted(pilot, str(msg["signal"]), float(msg["at"])))
            elif op == Op.EXITED:
                self._emit(ProcessExited(pilot, str(msg["key"]), int(msg["code"])))
            elif op == Op.BYE:
                log.info("pilot %s: bye (%s)", pilot, msg.get("reason", "no reason given"))
                self._drop(pilot, "bye")
            else:
                log.warning("pilot %s: unknown op %r ignored", pilot, op)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("pilot %s: malformed %r message ignored (%s): %r", pilot, op, exc, msg)

    def _register(self, identity: bytes, msg: dict[str, Any], frame: zmq.Frame) -> None:
        try:
            pilot, host = msg["pilot"], msg["host"]
            nodes, ends_at, nonce = msg["nodes"], msg["ends_at"], msg["nonce"]
            if not (isinstance(pilot, str) and pilot and isinstance(host, str)):
                raise TypeError("pilot and host must be strings")
            if not (isinstance(nodes, list) and all(isinstance(n, str) for n in nodes)):
                raise TypeError("nodes must be a list of strings")
            if not (is_nonce(nonce) and msg.get("seq") == 0 and msg.get("from") == "agent"):
                raise ValueError("no nonce, or not the first message of an agent")
            gpus = msg.get("gpus", 0)  # an agent of an older version sends none
            if type(gpus) is not int or not 0 <= gpus <= MAX_GPUS:
                raise ValueError(f"gpus must be an integer in [0, {MAX_GPUS}]")
            ends = None if ends_at is None else float(ends_at)
            up = PilotUp(pilot, tuple(nodes), ends, host, gpus)
        except (KeyError, TypeError, ValueError) as exc:
            self._refuse(identity, frame, f"malformed registration: {exc}")
            return
        with self._lock:
            replayed = nonce in self._nonces
            live, gone = pilot in self._peers, pilot in self._gone
            pending = len(self._pending)
        if replayed:
            self._refuse(identity, frame, "replayed registration")
            return
        if live or gone:
            state = "already registered by another agent" if live else "gone"
            self._refuse(identity, frame, f"pilot {pilot} is {state}")
            return
        if pending >= MAX_PENDING:
            self._refuse(identity, frame, "too many registrations pending")
            return
        wire = ServerSession(self.secret, nonce)
        now = time.monotonic()
        peer = _Peer(wire, up, identity, now, now)
        with self._lock:
            self._nonces.add(nonce)
            self._sessions[wire.id] = self._pending[wire.id] = peer
            old = self._by_identity.get(identity)
            if old is None or old.state != "live":
                self._by_identity[identity] = peer
        params = {
            "heartbeat_timeout_s": self.heartbeat_timeout_s,
            "ping_s": self.ping_s,
            "silence_s": self.silence_s,
        }
        self._send_frames(identity, wire.welcome(params), pilot, "welcome")

    def _confirm(self, peer: _Peer) -> None:
        """The agent's first message in a welcomed session: the pilot is up, unless its name
        became live (another agent with it) or gone meanwhile."""
        pilot = peer.up.pilot
        with self._lock:
            self._pending.pop(peer.wire.id, None)
            clash = pilot in self._peers or pilot in self._gone
            peer.state = "gone" if clash else "live"
            if not clash:
                self._peers[pilot] = peer
        if clash:
            self.refusals.add(pilot, f"pilot {pilot} is already registered or gone")
            peer.told_to_leave = True
            self._send_to(peer, {"op": Op.SHUTDOWN})
            return
        log.info("pilot %s up on %s: nodes %s", pilot, peer.up.host, ",".join(peer.up.nodes))
        self._emit(peer.up)

    def _drop(self, pilot: str, reason: str) -> None:
        with self._lock:
            peer = self._peers.pop(pilot, None)
            if peer is None:
                return
            peer.state = "gone"
            self._gone.add(pilot)
        self._emit(PilotGone(pilot, reason))

    def _check_heartbeats(self, now: float) -> None:
        with self._lock:
            late = [
                pilot
                for pilot, peer in self._peers.items()
                if now - peer.last_seen > self.heartbeat_timeout_s
            ]
            expired = [
                (sid, peer)
                for sid, peer in self._pending.items()
                if now - peer.started > self.heartbeat_timeout_s
            ]
            for sid, peer in expired:  # welcomed, never heard from again: forget it
                del self._sessions[sid], self._pending[sid]
                if self._by_identity.get(peer.identity) is peer:
                    del self._by_identity[peer.identity]
        for _, peer in expired:
            log.info("pilot %s: registration never confirmed: dropped", peer.up.pilot)
        for pilot in late:
            log.info("pilot %s: no message for %.1f s: gone", pilot, self.heartbeat_timeout_s)
            self._drop(pilot, "missed heartbeats")

    def _flush(self) -> None:
        while True:
            with self._lock:
                if not self._outbox:
                    return
                pilot, msg = self._outbox.popleft()
                peer = self._peers.get(pilot)
            if peer is None:
                log.info("pilot %s is not live: %r not sent", pilot, msg.get("op"))
                continue
            self._send_to(peer, msg)

    def _send_to(self, peer: _Peer, msg: dict[str, Any]) -> None:
        self._send_frames(peer.identity, peer.wire.seal(msg), peer.up.pilot, msg.get("op"))

    def _send_frames(self, identity: bytes, frames: list[bytes], name: str, op: object) -> None:
        assert self._sock is not None
        try:
            self._sock.send_multipart([identity, *frames], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # disconnected (ROUTER_MANDATORY) or its queue is full
            # A pilot that just died: expected, and its missed heartbeats will say so.
            log.info("%s: %r not sent: %s", name, op, exc)
