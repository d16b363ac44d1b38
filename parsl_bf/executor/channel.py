"""The channel between the executor and its pilot agents: JSON over ZeroMQ, encrypted with
CurveZMQ, every message signed and bound to its session by a counter.

Wire format
-----------
Every message is a JSON object sent as two frames, ``[signature, body]``, the signature being
the hex HMAC-SHA256 of the body under a secret the executor writes to a 0600 file that only its
pilots read (:func:`sign`, :func:`verify`). The frames travel over CurveZMQ: the server's key
pair and one client key pair are derived from that secret (:func:`curve_keys`), so the secret
file stays the one credential an agent needs, read from the shared file system as before. The
server authenticates clients by their key (a ZAP handler in its own thread of control).

Sessions
--------
An agent opens a session with ``register``, which carries a fresh random ``nonce`` (``N_a``)
and ``seq`` 0. The server answers ``welcome`` with ``session`` ``[N_a, N_s]`` (``N_s`` its own
fresh nonce) and ``seq`` 0. Every later message, either way, carries ``session`` ``[N_a, N_s]``,
``from`` (``"agent"`` or ``"server"``) and ``seq``, a counter strictly increasing per direction
(1, 2, ...), all inside the signed body (:class:`AgentSession`, :class:`ServerSession`). The
agent answers the welcome at once (a ``heartbeat``); only that first message in the session,
which proves that the agent holds the secret *and* saw ``N_s``, makes the pilot up.

Each agent (:mod:`parsl_bf.executor.agent`, a DEALER) says, by ``op``:

``register`` {pilot, nodes, ends_at, host, gpus, nonce}
    ``gpus``: each node's GPUs (0 on CPU nodes; absent from older agents: 0). Answered by
    ``welcome`` {heartbeat_timeout_s, ping_s, silence_s}; the agent's next message
    is reported as :class:`PilotUp`
``heartbeat``
    any message counts as a sign of life; none for ``heartbeat_timeout_s``: :class:`PilotGone`
``preempted`` {signal, at}
    :class:`PilotPreempted`
``exited`` {key, code}
    :class:`ProcessExited`
``bye`` {reason}
    :class:`PilotGone` with ``reason="bye"``

and is told, through :meth:`PilotServer.send`:

``launch`` {key, argv, env, cwd, stdout, stderr, warm?}
    start a process in its own session (``env`` is added to the agent's environment).
    ``"warm": true`` (plain apps) says that ``argv`` is
    :func:`parsl_bf.executor.runner.command`: the agent may fork it from its warm host
    (:mod:`parsl_bf.executor.warmhost`) instead, a process all the same to the executor (its
    own session, signalled by key, ``exited`` with its code; -9 if the host died under it).
    With ``"ranks": {first, count, of, mpiexec, hosts?, per_node?}`` (a fragment's ranks),
    ``argv`` is one rank's worker command and the agent starts ``count`` ranks, ``per_node``
    (default 1) to a node, each on a standby rank or as ``mpiexec -n 1``
    (:mod:`parsl_bf.executor.ranks`): one process to the executor
``warm_ranks`` {size, mpiexec}
    keep ``size`` standby ranks from now on (there is training to do)
``signal`` {key, signal}
    signal that process's whole group: ``"TERM"``, ``"KILL"`` or ``"USR1"``
``shutdown`` {}
    TERM every process, KILL what is left after 10 s, say ``bye``, exit 0

The server also sends ``ping`` every ``ping_s`` (at most ``silence_s / 4``). An agent that
hears nothing valid for ``silence_s`` (8 s unless the server says otherwise) takes the driver
for dead: it TERMs its process groups, KILLs what is left 1 s later and exits 4: all gone
within about 10 s of the driver's death.

Threat model
------------
Trusted: the executor's process and whoever can read the secret file, that is the user (or
root): the file is mode 0600 (:func:`read_secret` refuses one that others may read), as
Parsl's certificates directory is. Holding it is full control, as running jobs as the user is.

The adversary is anyone else who can reach the server's port or the path between the hosts:
it connects, sends anything, records traffic and replays it (byte for byte, from a new
socket, now or later), relays or reorders it, and floods. What holds against it:

* Confidentiality and peer authentication, by CurveZMQ: nothing (argv, environment, keys) is
  readable on the wire; an agent talks only to the holder of the server's key; the server
  accepts only the client key (its ZAP handler), so a socket without the secret never gets a
  frame to the application. CurveZMQ's per-connection keys make a recorded TCP stream useless
  on any other connection. Handshake failures are reported as :class:`Refused`.
* Integrity and replay, by the signed sessions, also for a peer that got past the transport
  (a buggy agent, a relay of decrypted frames): the server refuses a ``register`` whose nonce
  it has seen (``replayed registration``), a message of a session it does not know (another
  run's, a pending registration that expired, a made-up one), one whose counter is not above
  the last it accepted in that session (``replayed or stale``), and one in the wrong
  direction (a reflected server message). A replayed ``register`` therefore registers nothing:
  a pending registration touches no live pilot, the names of live and gone pilots cannot be
  registered again, and a pilot is up only after a message that needs both nonces and the
  secret. A replayed heartbeat keeps nothing alive. The agent likewise refuses a ``welcome``
  that does not answer its own nonce and any message of another session or with an old
  counter, so a recorded ``launch`` runs nothing. Sessions, not sockets, own the counters: a
  message with a fresh counter on a new connection (a TCP reconnect) moves the route there.
* Flooding: refusals are aggregated (:class:`RefusalLog`): at most one log line per second,
  and at most one :class:`Refused` per (peer, reason) per second carrying the ``count`` (at
  most 20 kinds a second; the rest are lumped together). The server reads at most
  ``MAX_BATCH`` messages between its pings and heartbeat checks, so a flood does not starve
  them.
* A dead driver: agents notice its silence within ``silence_s`` and stop everything they
  started; its ranks do not go on training.

Not covered: a holder of the secret; exhausting connections or bandwidth (a flood is bounded
in log lines and events, not in CPU); traffic analysis (sizes and timing stay visible).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import math
import os
import secrets
import socket
import stat
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from .gpus import MAX_GPUS

__all__ = [
    "AgentSession",
    "CurveKeys",
    "Event",
    "PilotGone",
    "PilotPreempted",
    "PilotServer",
    "PilotUp",
    "SILENCE_S",
    "UNAUTHENTICATED",
    "ProcessExited",
    "Refused",
    "RefusalLog",
    "ServerSession",
    "client_socket",
    "curve_keys",
    "new_nonce",
    "new_secret",
    "read_secret",
    "sign",
    "verify",
    "write_secret",
]

log = logging.getLogger(__name__)

#: How long an agent waits without a valid message before it takes the driver for dead.
SILENCE_S = 8.0
#: Messages the server reads before it looks at its pings and heartbeats again.
MAX_BATCH = 500
#: Registrations waiting for the agent's first message in the session, at most.
MAX_PENDING = 4096
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
#: The peer of a refused CurveZMQ handshake (ZeroMQ does not say whose it was).
UNAUTHENTICATED = "an unauthenticated peer"


# --- wire format ----------------------------------------------------------------------------


def _digest(secret: bytes, body: bytes) -> bytes:
    return hmac.new(secret, body, hashlib.sha256).hexdigest().encode()


def sign(secret: bytes, msg: dict[str, Any]) -> list[bytes]:
    """The frames ``[signature, body]`` that carry ``msg`` (a JSON-serialisable dict).

    This signs ``msg`` as it is: session fields (``session``, ``seq``, ``from``) are added by
    :class:`AgentSession` and :class:`ServerSession`, which call it."""
    body = json.dumps(msg, separators=(",", ":")).encode()
    return [_digest(secret, body), body]


def verify(secret: bytes, frames: Sequence[bytes]) -> dict[str, Any] | None:
    """The message in ``frames`` if its signature verifies and it is a JSON object, else None.

    A verified message may still be a replay: the sessions' ``accept``/``open`` decide that."""
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
    """The secret in a file written by :func:`write_secret` (surrounding whitespace ignored).

    Raises ValueError for an empty file or one that its group or others may read or write."""
    with open(path, "rb") as f:
        mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        if mode & 0o077:
            raise ValueError(f"{path}: mode {mode:04o}: others may read the secret (want 0600)")
        secret = f.read().strip()
    if not secret:
        raise ValueError(f"{path}: empty secret file")
    return secret


# --- transport keys -------------------------------------------------------------------------


@dataclass(frozen=True)
class CurveKeys:
    """The channel's CurveZMQ keys (Z85, 40 bytes each), all derived from the secret."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def curve_keys(secret: bytes) -> CurveKeys:
    """The server's and the clients' key pairs for ``secret`` (HMAC-SHA256 with a label each:
    any 32 bytes are a Curve25519 secret key)."""

    def pair(label: bytes) -> tuple[bytes, bytes]:
        key = z85.encode(hmac.new(secret, b"parsl-bf curve " + label, hashlib.sha256).digest())
        return zmq.curve_public(key), key

    server_public, server_secret = pair(b"server")
    client_public, client_secret = pair(b"client")
    return CurveKeys(server_public, server_secret, client_public, client_secret)


def client_socket(ctx: zmq.Context, secret: bytes, socket_type: int = zmq.DEALER) -> zmq.Socket:
    """A socket of ``ctx`` set up as a CurveZMQ client of the server of ``secret`` (not yet
    connected): what an agent, real or simulated, talks to the :class:`PilotServer` with."""
    keys = curve_keys(secret)
    sock = ctx.socket(socket_type)
    sock.curve_secretkey = keys.client_secret
    sock.curve_publickey = keys.client_public
    sock.curve_serverkey = keys.server_public
    return sock


# --- sessions -------------------------------------------------------------------------------


def new_nonce() -> str:
    """A fresh random session nonce (32 hex characters)."""
    return secrets.token_hex(16)


def _is_nonce(value: object) -> bool:
    return (
        isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)
    )


def _is_seq(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def session_of(msg: dict[str, Any]) -> tuple[str, str] | None:
    """The ``(N_a, N_s)`` that ``msg`` claims to belong to, if it is well formed."""
    sid = msg.get("session")
    if isinstance(sid, list) and len(sid) == 2 and all(_is_nonce(n) for n in sid):
        return sid[0], sid[1]
    return None


class _Session:
    """What both ends of a session share: the nonces and a counter per direction."""

    me = peer = ""  # "agent" or "server"

    def __init__(self, secret: bytes, agent_nonce: str, server_nonce: str | None) -> None:
        self.secret = secret
        self.agent_nonce, self.server_nonce = agent_nonce, server_nonce
        self.sent = 0  # the counter of the last message sent (0: register or welcome)
        self.received = -1  # the counter of the last message accepted

    @property
    def id(self) -> tuple[str, str]:
        assert self.server_nonce is not None
        return self.agent_nonce, self.server_nonce

    def seal(self, msg: dict[str, Any]) -> list[bytes]:
        """The frames of ``msg`` as this session's next message."""
        self.sent += 1
        fields = {"from": self.me, "session": list(self.id), "seq": self.sent}
        return sign(self.secret, {**msg, **fields})

    def accept(self, msg: dict[str, Any]) -> str | None:
        """Check a verified message for this session: None and the counter moves on, or why
        it is refused."""
        if msg.get("from") != self.peer:
            return f"wrong direction (from {msg.get('from')!r})"
        if self.server_nonce is None or session_of(msg) != self.id:
            return "another session"
        seq = msg.get("seq")
        if not _is_seq(seq):
            return "no sequence number"
        if seq <= self.received:
            return f"replayed or stale (seq {seq}, last {self.received})"
        self.received = seq
        return None


class AgentSession(_Session):
    """The agent's end of one session (no sockets): :meth:`register` first, :meth:`open` what
    arrives (the welcome establishes the session), then :meth:`seal` what to send."""

    me, peer = "agent", "server"

    def __init__(self, secret: bytes, nonce: str | None = None) -> None:
        super().__init__(secret, nonce or new_nonce(), None)

    @property
    def established(self) -> bool:
        """Whether the server's welcome arrived (and :meth:`seal` may be used)."""
        return self.server_nonce is not None

    def register(self, msg: dict[str, Any]) -> list[bytes]:
        """The frames of the ``register`` message ``msg`` (pilot, nodes, ends_at, host)."""
        fields = {"op": "register", "from": self.me, "nonce": self.agent_nonce, "seq": 0}
        return sign(self.secret, {**msg, **fields})

    def seal(self, msg: dict[str, Any]) -> list[bytes]:
        if not self.established:
            raise RuntimeError("no welcome yet: only register() may be sent")
        return super().seal(msg)

    def open(self, frames: Sequence[bytes]) -> tuple[dict[str, Any] | None, str]:
        """``(message, "")`` for a valid next message from the server, else ``(None, why)``."""
        msg = verify(self.secret, frames)
        if msg is None:
            return None, "bad signature"
        if not self.established:
            sid = session_of(msg)
            if msg.get("op") != "welcome" or msg.get("from") != self.peer:
                return None, f"{msg.get('op')!r} before the welcome"
            if sid is None or sid[0] != self.agent_nonce or msg.get("seq") != 0:
                return None, "welcome of another session"
            self.server_nonce, self.received = sid[1], 0
            return msg, ""
        reason = self.accept(msg)
        return (None, reason) if reason else (msg, "")


class ServerSession(_Session):
    """The server's end of one session (no sockets), made for a verified ``register``."""

    me, peer = "server", "agent"

    def __init__(self, secret: bytes, agent_nonce: str) -> None:
        super().__init__(secret, agent_nonce, new_nonce())
        self.received = 0  # the register

    def welcome(self, msg: dict[str, Any]) -> list[bytes]:
        """The frames of the ``welcome`` (``msg``: its parameters), counter 0."""
        fields = {"op": "welcome", "from": self.me, "session": list(self.id), "seq": 0}
        return sign(self.secret, {**msg, **fields})


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


@dataclass(frozen=True)
class Refused:
    """``count`` messages (or connections) from ``peer`` were dropped for ``reason`` since the
    last such event: ``"bad signature"``, ``"unknown session"``, ``"replayed registration"``,
    ``"replayed or stale (...)"``, a CurveZMQ handshake that failed, a registration that is
    malformed or names a pilot already live or gone, ... At most one per (peer, reason) per
    second (:class:`RefusalLog`). ``peer`` is a pilot, an address, or :data:`UNAUTHENTICATED`
    for a connection whose handshake failed (ZeroMQ does not say whose)."""

    peer: str
    reason: str
    count: int = 1


Event = PilotUp | PilotPreempted | PilotGone | ProcessExited | Refused


class RefusalLog:
    """Refusals, aggregated: at most one log line and one :class:`Refused` per (peer, reason)
    every ``interval_s``; the first after a quiet interval goes out at once.

    ``emit`` gets the events; :meth:`flush` should be called now and then (the server's loop
    does) so that what was held back goes out. Not thread-safe: one thread's."""

    OTHERS = "other peers"

    def __init__(
        self,
        emit: Callable[[Refused], None],
        logger: logging.Logger,
        interval_s: float = 1.0,
        max_kinds: int = 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.emit, self.logger = emit, logger
        self.interval_s, self.max_kinds, self.clock = interval_s, max_kinds, clock
        self.total = 0  # refusals ever
        self._pending: Counter[tuple[str, str]] = Counter()
        self._last = -math.inf

    def add(self, peer: str, reason: str) -> None:
        self.total += 1
        key, others = (peer, reason), (self.OTHERS, "various")
        if key not in self._pending and len(self._pending) >= self.max_kinds - (
            others not in self._pending
        ):
            key = others  # one of the max_kinds is for the rest
        self._pending[key] += 1
        self.flush()

    def flush(self, force: bool = False) -> None:
        if not self._pending:
            return
        now = self.clock()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        pending, self._pending = self._pending, Counter()
        n = sum(pending.values())
        if n == 1:
            [(peer, reason)] = pending
            self.logger.warning("refused message from %s: %s", peer, reason)
        else:
            kinds = pending.most_common()
            shown = "; ".join(f"{c} from {p}: {r}" for (p, r), c in kinds[:5])
            more = f"; and {len(kinds) - 5} more kinds" if len(kinds) > 5 else ""
            self.logger.warning("refused %d messages: %s%s", n, shown, more)
        for (peer, reason), count in pending.items():
            self.emit(Refused(peer, reason, count))


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
                        self._send_to(peer, {"op": "ping"})
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
        if op == "register" and "session" not in msg:
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
                self._send_to(peer, {"op": "shutdown"})
            return
        self._dispatch(peer.up.pilot, op, msg)

    def _dispatch(self, pilot: str, op: object, msg: dict[str, Any]) -> None:
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
            nodes, ends_at, nonce = msg["nodes"], msg["ends_at"], msg["nonce"]
            if not (isinstance(pilot, str) and pilot and isinstance(host, str)):
                raise TypeError("pilot and host must be strings")
            if not (isinstance(nodes, list) and all(isinstance(n, str) for n in nodes)):
                raise TypeError("nodes must be a list of strings")
            if not (_is_nonce(nonce) and msg.get("seq") == 0 and msg.get("from") == "agent"):
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
            self._send_to(peer, {"op": "shutdown"})
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
