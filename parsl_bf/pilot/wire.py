"""The wire contract between the executor and its pilot agents, defined once for both ends:
JSON over ZeroMQ, encrypted with CurveZMQ, every message signed and bound to its session by a
counter. The executor's end (:class:`~parsl_bf.executor.channel.PilotServer`) and the agent
(:mod:`parsl_bf.pilot.agent`) import this module; it imports nothing of either.

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

Each agent (:mod:`parsl_bf.pilot.agent`, a DEALER) says, by ``op`` (the events named are the
executor's, :mod:`parsl_bf.executor.channel`):

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

and is told, through :meth:`~parsl_bf.executor.channel.PilotServer.send`:

``launch`` {key, argv, env, cwd, stdout, stderr, warm?}
    start a process in its own session (``env`` is added to the agent's environment).
    ``"warm": true`` (plain apps) says that ``argv`` is
    :func:`parsl_bf.pilot.outcome.command`: the agent may fork it from its warm host
    (:mod:`parsl_bf.pilot.warmhost`) instead, a process all the same to the executor (its
    own session, signalled by key, ``exited`` with its code; -9 if the host died under it).
    With :data:`RANKS_KEY` ``{first, count, of, mpiexec, hosts?, per_node?}`` (a fragment's ranks),
    ``argv`` is one rank's worker command and the agent starts ``count`` ranks, ``per_node``
    (default 1) to a node, each on a standby rank or as ``mpiexec -n 1``
    (:mod:`parsl_bf.pilot.ranks`): one process to the executor
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

import hashlib
import hmac
import json
import logging
import math
import os
import secrets
import stat
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import zmq
from zmq.utils import z85

__all__ = [
    "Op",
    "AGENT_MODULE",
    "AgentSession",
    "CurveKeys",
    "MAX_GPUS",
    "RANKS_KEY",
    "Refused",
    "RefusalLog",
    "SILENCE_S",
    "ServerSession",
    "UNAUTHENTICATED",
    "client_socket",
    "curve_keys",
    "is_nonce",
    "new_nonce",
    "new_secret",
    "read_secret",
    "session_of",
    "sign",
    "standbys_for",
    "verify",
    "write_secret",
]


class Op(StrEnum):
    """A message's ``op`` (module docstring): from the agent ``register``, ``heartbeat``,
    ``preempted``, ``exited``, ``bye``; from the executor ``welcome``, ``launch``, ``signal``,
    ``warm_ranks``, ``shutdown``, ``ping``."""

    REGISTER = "register"
    WELCOME = "welcome"
    HEARTBEAT = "heartbeat"
    PREEMPTED = "preempted"
    EXITED = "exited"
    BYE = "bye"
    LAUNCH = "launch"
    SIGNAL = "signal"
    SHUTDOWN = "shutdown"
    PING = "ping"
    WARM_RANKS = "warm_ranks"


#: The agent's module: a pilot runs ``python -m AGENT_MODULE --url URL --secret-file FILE``.
AGENT_MODULE = "parsl_bf.pilot.agent"
#: How long an agent waits without a valid message before it takes the driver for dead.
SILENCE_S = 8.0
#: The peer of a refused CurveZMQ handshake (ZeroMQ does not say whose it was).
UNAUTHENTICATED = "an unauthenticated peer"
#: A bound on the GPUs a ``register`` may report for a node (a registration is untrusted input).
MAX_GPUS = 64
#: The ``launch`` field that makes it a fragment's ranks: {"first", "count", "of", "mpiexec",
#: "hosts"? (one per rank), "per_node"? (ranks to a node, one per GPU; default 1)}; ``argv`` is
#: then one rank's worker command without ``--group``/``--groups``.
RANKS_KEY = "ranks"


def standbys_for(nodes: Sequence[str], host: str, gpus: int) -> int:
    """How many standby ranks a pilot's agent on ``host`` keeps (the ``size`` of its
    ``warm_ranks``): one for each rank that may run on this host (a rank per GPU of each node,
    one per node without). When the host is one of the pilot's ``nodes`` they are separate
    hosts, and only this one's ranks are warm here: a standby is a process of this host, and
    the other hosts' ranks start cold (``mpiexec -hosts`` through the job's steps) since no
    agent runs there. Otherwise (emulated nodes, a loopback cluster's nodes) every node is this
    host."""
    here = 1 if host in nodes else len(nodes)
    return max(1, here) * max(1, gpus)


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


def is_nonce(value: object) -> bool:
    return (
        isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)
    )


def _is_seq(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def session_of(msg: dict[str, Any]) -> tuple[str, str] | None:
    """The ``(N_a, N_s)`` that ``msg`` claims to belong to, if it is well formed."""
    sid = msg.get("session")
    if isinstance(sid, list) and len(sid) == 2 and all(is_nonce(n) for n in sid):
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
        fields = {"op": Op.REGISTER, "from": self.me, "nonce": self.agent_nonce, "seq": 0}
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
        fields = {"op": Op.WELCOME, "from": self.me, "session": list(self.id), "seq": 0}
        return sign(self.secret, {**msg, **fields})


# --- refusals -------------------------------------------------------------------------------


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
