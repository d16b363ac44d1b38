"""The channel between the executor and its pilot agents: signed JSON over ZeroMQ.

Every message is a JSON object sent as two frames, ``[signature, body]``, the signature being
the hex HMAC-SHA256 of the body under a secret the executor writes to a 0600 file that only
its pilots read. A message whose signature does not verify is dropped, logged and reported as
:class:`Refused`; it is never acted on (a launch command runs arbitrary programs).

The executor's end is :class:`PilotServer`, a ROUTER socket served by one thread. Each agent
(:mod:`parsl_bf.executor.agent`, a DEALER) says, by ``op``:

``register`` {pilot, nodes, ends_at, host}
    answered by ``welcome`` {heartbeat_timeout_s, ping_s}; reported as :class:`PilotUp`
``heartbeat``
    any message counts as a sign of life; none for ``heartbeat_timeout_s``: :class:`PilotGone`
``preempted`` {signal, at}
    :class:`PilotPreempted`
``exited`` {key, code}
    :class:`ProcessExited`
``bye`` {reason}
    :class:`PilotGone` with ``reason="bye"``

and is told, through :meth:`PilotServer.send`:

``launch`` {key, argv, env, cwd, stdout, stderr}
    start a process in its own session (``env`` is added to the agent's environment)
``signal`` {key, signal}
    signal that process's whole group: ``"TERM"``, ``"KILL"`` or ``"USR1"``
``shutdown`` {}
    TERM every process, KILL what is left after 10 s, say ``bye``, exit 0

The server also sends ``ping`` every ``ping_s`` so that an agent notices a vanished executor.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

__all__ = [
    "Event",
    "PilotGone",
    "PilotPreempted",
    "PilotServer",
    "PilotUp",
    "ProcessExited",
    "Refused",
    "new_secret",
    "read_secret",
    "sign",
    "verify",
    "write_secret",
]

log = logging.getLogger(__name__)


# --- wire format ----------------------------------------------------------------------------


def _digest(secret: bytes, body: bytes) -> bytes:
    return hmac.new(secret, body, hashlib.sha256).hexdigest().encode()


def sign(secret: bytes, msg: dict[str, Any]) -> list[bytes]:
    """The frames ``[signature, body]`` that carry ``msg`` (a JSON-serialisable dict)."""
    body = json.dumps(msg, separators=(",", ":")).encode()
    return [_digest(secret, body), body]


def verify(secret: bytes, frames: Sequence[bytes]) -> dict[str, Any] | None:
    """The message in ``frames`` if its signature verifies and it is a JSON object, else None."""
    if len(frames) != 2:
        return None
    signature, body = (bytes(f) for f in frames)
    if not hmac.compare_digest(signature, _digest(secret, body)):
        return None
    try:
        msg = json.loads(body)
    except ValueError:  # includes bad UTF-8; only our own peer could have signed it anyway
        return None
    return msg if isinstance(msg, dict) else None


def new_secret() -> bytes:
    """A fresh random secret (64 hex characters, so that the secret file is plain text)."""
    return secrets.token_hex(32).encode()


def write_secret(path: str | os.PathLike[str]) -> bytes:
    """Write a new secret to ``path``, readable by its owner only (mode 0600); return it."""
    secret = new_secret()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the mode argument is ignored when the file already existed
        os.write(fd, secret)
    finally:
        os.close(fd)
    return secret


def read_secret(path: str | os.PathLike[str]) -> bytes:
    """The secret in a file written by :func:`write_secret` (surrounding whitespace ignored)."""
    secret = Path(path).read_bytes().strip()
    if not secret:
        raise ValueError(f"{path}: empty secret file")
    return secret


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PilotUp:
    """A pilot's agent registered: its nodes, its walltime end (epoch seconds) and host."""

    pilot: str
    nodes: tuple[str, ...]
    ends_at: float | None
    host: str


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


@dataclass(frozen=True)
class Refused:
    """A message was dropped: ``"bad signature"``, ``"not registered"`` (from an agent that
    never registered), or a registration that is malformed or names a pilot already live."""

    peer: str
    reason: str


Event = PilotUp | PilotPreempted | PilotGone | ProcessExited | Refused


# --- the executor's end ---------------------------------------------------------------------


@dataclass
class _Peer:
    up: PilotUp
    identity: bytes
    last_seen: float  # time.monotonic()


class PilotServer:
    """The executor's end of the channel: a ROUTER socket that pilot agents connect to.

    ``on_event`` receives the :data:`Event` objects, called from the server's thread: it should
    only record or enqueue them. :meth:`send` may be called from any thread.
    """

    def __init__(
        self,
        secret: bytes,
        on_event: Callable[[object], None],
        address: str = "127.0.0.1",
        heartbeat_timeout_s: float = 10.0,
    ) -> None:
        if heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be positive, not {heartbeat_timeout_s}")
        self.secret = secret
        self.on_event = on_event
        self.address = address
        self.heartbeat_timeout_s = heartbeat_timeout_s
        # Agents give up on us after 3 timeouts of silence: several pings fit in one timeout.
        self.ping_s = heartbeat_timeout_s / 4
        self._url: str | None = None
        self._lock = threading.Lock()
        self._peers: dict[str, _Peer] = {}
        self._by_identity: dict[bytes, str] = {}
        self._gone: dict[bytes, str] = {}  # identity -> pilot id, of pilots reported gone
        self._outbox: deque[tuple[str, dict[str, Any]]] = deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._wake_r = self._wake_w = -1

    # --- public API -------------------------------------------------------------------------

    def start(self) -> None:
        """Bind to a random port on ``address`` and serve from a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("PilotServer already started")
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        # Raise on a send to a peer that has disconnected, instead of dropping it silently.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
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
        log.info("pilot server listening on %s", self._url)

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
        self._sock.close(linger=1000)  # let the last commands (a shutdown) reach the agents
        self._ctx.term()
        os.close(self._wake_r)
        os.close(self._wake_w)
        log.info("pilot server on %s stopped", self._url)

    # --- the server's thread ----------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full pipe: a wake-up is pending
            os.write(self._wake_w, b"x")

    def _loop(self) -> None:
        assert self._sock is not None
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        next_ping = time.monotonic() + self.ping_s
        while not self._stopping:
            try:
                ready = dict(poller.poll(timeout=min(self.ping_s, 0.5) * 1000))
                if self._wake_r in ready:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                if self._sock in ready:
                    self._receive_all()
                self._flush()
                now = time.monotonic()
                if now >= next_ping:
                    for pilot in self.pilots:
                        self._send_now(pilot, {"op": "ping"})
                    next_ping = now + self.ping_s
                self._check_heartbeats(now)
            except Exception:  # keep serving: one bad message must not cut off every pilot
                log.exception("pilot server loop failed; continuing")
        self._flush()

    def _emit(self, event: object) -> None:
        try:
            self.on_event(event)
        except Exception:
            log.exception("pilot event handler failed on %r", event)

    def _receive_all(self) -> None:
        assert self._sock is not None
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity = frames[0].bytes
            msg = verify(self.secret, [f.bytes for f in frames[1:]])
            if msg is None:
                peer = self._peer_name(identity, frames[-1])
                log.warning("refused message from %s: bad signature", peer)
                self._emit(Refused(peer, "bad signature"))
                continue
            self._handle(identity, msg, frames[-1])

    def _peer_name(self, identity: bytes, frame: zmq.Frame) -> str:
        with self._lock:
            pilot = self._by_identity.get(identity)
        if pilot is not None:
            return pilot
        try:
            address = frame.get("Peer-Address")
        except zmq.ZMQError:  # metadata is not available on every transport
            address = "?"
        return f"{address} ({identity.hex()})"

    def _refuse(self, identity: bytes, frame: zmq.Frame, reason: str) -> None:
        peer = self._peer_name(identity, frame)
        log.warning("refused message from %s: %s", peer, reason)
        self._emit(Refused(peer, reason))

    def _handle(self, identity: bytes, msg: dict[str, Any], frame: zmq.Frame) -> None:
        op = msg.get("op")
        if op == "register":
            self._register(identity, msg, frame)
            return
        with self._lock:
            pilot = self._by_identity.get(identity)
            peer = self._peers.get(pilot) if pilot is not None else None
            if peer is not None:
                peer.last_seen = time.monotonic()
        if peer is None or pilot is None:
            gone = self._gone.get(identity)
            if gone is None:
                self._refuse(identity, frame, "not registered")
            elif op != "bye":
                # One of our agents that we gave up on (it stalled past the heartbeat timeout):
                # its pilot was reported gone, so its processes now duplicate work.
                log.warning("pilot %s is gone: %r ignored, telling it to shut down", gone, op)
                self._send_to(identity, {"op": "shutdown"}, gone)
            return
        try:
            if op == "heartbeat":
                pass
            elif op == "preempted":
                log.info("pilot %s: preempted (SIG%s)", pilot, msg["signal"])
                self._emit(PilotPreempted(pilot, str(msg["signal"]), float(msg["at"])))
            elif op == "exited":
                self._emit(ProcessExited(pilot, str(msg["key"]), int(msg["code"])))
            elif op == "bye":
                log.info("pilot %s: bye (%s)", pilot, msg.get("reason", "no reason given"))
                self._drop(pilot, "bye")
            else:
                log.warning("pilot %s: unknown op %r ignored", pilot, op)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("pilot %s: malformed %r message ignored (%s): %r", pilot, op, exc, msg)

    def _register(self, identity: bytes, msg: dict[str, Any], frame: zmq.Frame) -> None:
        try:
            pilot, host = msg["pilot"], msg["host"]
            nodes, ends_at = msg["nodes"], msg["ends_at"]
            if not (isinstance(pilot, str) and pilot and isinstance(host, str)):
                raise TypeError("pilot and host must be strings")
            if not (isinstance(nodes, list) and all(isinstance(n, str) for n in nodes)):
                raise TypeError("nodes must be a list of strings")
            up = PilotUp(pilot, tuple(nodes), None if ends_at is None else float(ends_at), host)
        except (KeyError, TypeError, ValueError) as exc:
            self._refuse(identity, frame, f"malformed registration: {exc}")
            return
        with self._lock:
            current = self._peers.get(pilot)
            clash = current is not None and current.identity != identity
            if not clash:
                self._peers[pilot] = _Peer(up, identity, time.monotonic())
                self._by_identity[identity] = pilot
                self._gone.pop(identity, None)
        if clash:
            self._refuse(identity, frame, f"pilot {pilot} is already registered by another agent")
            return
        self._send_to(
            identity,
            {
                "op": "welcome",
                "heartbeat_timeout_s": self.heartbeat_timeout_s,
                "ping_s": self.ping_s,
            },
        )
        if current is None:  # a repeated register from the same agent is only welcomed again
            log.info("pilot %s up on %s: nodes %s", pilot, host, ",".join(up.nodes))
            self._emit(up)

    def _drop(self, pilot: str, reason: str) -> None:
        with self._lock:
            peer = self._peers.pop(pilot, None)
            if peer is None:
                return
            self._by_identity.pop(peer.identity, None)
            self._gone[peer.identity] = pilot
        self._emit(PilotGone(pilot, reason))

    def _check_heartbeats(self, now: float) -> None:
        with self._lock:
            late = [
                pilot
                for pilot, peer in self._peers.items()
                if now - peer.last_seen > self.heartbeat_timeout_s
            ]
        for pilot in late:
            log.info("pilot %s: no message for %.1f s: gone", pilot, self.heartbeat_timeout_s)
            self._drop(pilot, "missed heartbeats")

    def _flush(self) -> None:
        while True:
            with self._lock:
                if not self._outbox:
                    return
                pilot, msg = self._outbox.popleft()
            self._send_now(pilot, msg)

    def _send_now(self, pilot: str, msg: dict[str, Any]) -> None:
        with self._lock:
            peer = self._peers.get(pilot)
        if peer is None:
            log.info("pilot %s is not live: %r not sent", pilot, msg.get("op"))
            return
        self._send_to(peer.identity, msg, pilot)

    def _send_to(self, identity: bytes, msg: dict[str, Any], name: str | None = None) -> None:
        assert self._sock is not None
        try:
            self._sock.send_multipart([identity, *sign(self.secret, msg)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # disconnected (ROUTER_MANDATORY) or its queue is full
            # A pilot that just died: expected, and its missed heartbeats will say so.
            log.info("%s: %r not sent: %s", name or identity.hex(), msg.get("op"), exc)
