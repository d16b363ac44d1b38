"""A warm successor takes its state from the stopping ranks' memory instead of from the file.

At a warm rescale the new ranks are set up (``--ready``) before the old ones are told to stop.
Before this module, the state passed through the old ranks' last checkpoint: rank 0 saved it
(with a digest and an fsync), and the new ranks waited for the file, then read and verified it.
For ResNet-18 that round trip was most of a shrink or a grow (docs/training.md, "Rescaling").

Now the state goes over the network first and to the file after:

- each new rank listens on a TCP port of its host and says so, before it reports ready, in
  ``<checkpoint dir>/.handover/<rank>.json``: host, port and a random token (mode 0600). A
  listener first proves it knows the token (an HMAC of it), so a port that another program
  reuses after a crash gets nothing;
- the stopping fragment's rank 0 serialises its final state once and sends it to every rank
  that listens (:func:`offer`), then writes its checkpoint as before;
- a new rank takes a state only from a sender that knows its token, of at most the length
  announced and :data:`MAX_BYTES`, and reads it with ``torch.load(weights_only=True)``, as a
  checkpoint file. The stream is not digested: the digest guards files on disk;
- the new ranks agree (in :func:`~parsl_bf.training.checkpoint.agreed_latest`): all use what
  was sent, or all read the files as before
  (a predecessor that was killed, a connection that failed, a state of another model).

A stopping fragment with no listener (a preemption: its successor starts later) only writes
the file. The file is still written in every case, so nothing is less durable than before.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import json
import logging
import os
import secrets
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = [
    "DIR",
    "MAX_BYTES",
    "MODES",
    "NETWORK_FS",
    "Receiver",
    "filesystem",
    "offer",
    "serialise",
    "use_peer",
]

#: How a warm successor takes the state (the worker's ``--handover``): see :func:`use_peer`.
MODES = ("auto", "peer", "file")
#: The directory, inside a checkpoint directory, where listening new ranks say where they are.
DIR = ".handover"
#: The largest state a new rank accepts (bytes): a bound, so a bad length cannot exhaust memory.
MAX_BYTES = 1 << 38
_HEADER = struct.Struct("!32sQ")  # the token (hex), the state's length
_CONNECT_S = 2.0  # a listener that does not answer by then is not waiting any more


#: File systems on which a checkpoint's round trip goes over the network. There (``auto``) a
#: warm successor takes the state over a socket; on a local disk the page cache makes the file
#: as fast (measured: docs/training.md, "Rescaling").
NETWORK_FS = frozenset(
    {"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph", "glusterfs", "panfs"}
    | {"wekafs", "orangefs", "pvfs2", "9p", "fuse.ceph", "fuse.glusterfs", "fuse.sshfs"}
)


def filesystem(path: str | Path, mounts: str = "/proc/mounts") -> str | None:
    """The type of the file system holding ``path`` (the longest mount point above it)."""
    target = os.path.realpath(path)
    best, kind = "", None
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def use_peer(mode: str, checkpoint_dir: str | Path) -> bool:
    """Whether a warm successor listens for the state: ``peer``, ``file``, or ``auto`` (peer
    where the checkpoint directory is on a network file system)."""
    if mode == "auto":
        return filesystem(checkpoint_dir) in NETWORK_FS
    return mode == "peer"


def serialise(state: dict[str, Any]) -> bytes:
    """``state`` as ``torch.save`` writes it: what :func:`offer` sends."""
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


class Receiver:
    """One new rank's listener: ``state`` is set once a sender with the token has sent one."""

    def __init__(self, checkpoint_dir: str | Path, rank: int) -> None:
        self.dir = Path(checkpoint_dir) / DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / f"{rank}.json"
        self.token = secrets.token_hex(16).encode()
        self.state: dict[str, Any] | None = None
        self.received_at: float | None = None
        self._sock = socket.create_server(("", 0))
        self._sock.settimeout(0.2)  # so that close() ends the thread soon
        self._closed = False
        port = self._sock.getsockname()[1]
        record = {"host": socket.gethostname(), "port": port, "token": self.token.decode()}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, self.path)
        self._thread = threading.Thread(target=self._serve, name="handover", daemon=True)
        self._thread.start()

    @property
    def got(self) -> bool:
        return self.state is not None

    def _serve(self) -> None:
        while not self._closed and self.state is None:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn, contextlib.suppress(Exception):  # a bad sender is ignored, not fatal
                conn.sendall(_proof(self.token))  # this listener is the one in the record
                self._take(conn)

    def _take(self, conn: socket.socket) -> None:
        import torch

        conn.settimeout(30.0)
        token, length = _HEADER.unpack(_read(conn, _HEADER.size))
        if not hmac.compare_digest(token, self.token) or length > MAX_BYTES:
            log.warning("hand-over: refused a sender without the token or with %d bytes", length)
            return
        data = _read(conn, length)
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if isinstance(state, dict):
            self.received_at = time.time()
            self.state = state

    def close(self) -> None:
        """Stop listening and remove the record (idempotent)."""
        self._closed = True
        self.path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self._sock.close()
        self._thread.join(timeout=5)


def _proof(token: bytes) -> bytes:
    """What a listener sends first: shows it knows the token, without giving it away (a port
    reused by another program since the record was written gets no state)."""
    return hmac.new(token, b"parsl-bf hand-over listener", "sha256").digest()


def _read(conn: socket.socket, n: int) -> bytes:
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        k = conn.recv_into(view[got:])
        if not k:
            raise ConnectionError(f"hand-over: the sender closed after {got} of {n} bytes")
        got += k
    return bytes(buffer)


def offer(checkpoint_dir: str | Path, data: bytes) -> int:
    """Send ``data`` (a :func:`serialise`'d state) to every new rank listening for this
    checkpoint directory; how many took it. Never raises: the file is the fallback."""
    sent = 0
    here = socket.gethostname()
    for record_path in sorted((Path(checkpoint_dir) / DIR).glob("*.json")):
        try:
            record = json.loads(record_path.read_text())
            host = "127.0.0.1" if record["host"] == here else str(record["host"])
            token = str(record["token"]).encode()
            with socket.create_connection((host, int(record["port"])), _CONNECT_S) as conn:
                conn.settimeout(_CONNECT_S)
                if not hmac.compare_digest(_read(conn, 32), _proof(token)):
                    raise ValueError("the listener does not know the token")
                conn.settimeout(30.0)
                conn.sendall(_HEADER.pack(token, len(data)))
                conn.sendall(data)
            sent += 1
        except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
            log.info("hand-over: %s not reached (%s): the file will do", record_path.name, exc)
    return sent
