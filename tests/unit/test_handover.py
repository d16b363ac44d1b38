"""The hand-over of a stopping fragment's state to its warm successor (parsl_bf.training.handover)
over real sockets, in one process: what is sent is what the file holds; a sender or listener
without the token gets nothing; a listener that is gone costs the sender nothing but the file."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import torch

from parsl_bf.training import handover
from parsl_bf.training.checkpoint import agreed_latest, checkpoints, load, save_checkpoint


class _World:
    """A one-rank communicator for the collective helpers (what MPI.COMM_SELF does)."""

    rank, size = 0, 1

    def Allreduce(self, sendbuf, recvbuf=None, op=None) -> None:  # noqa: N802 (MPI's name)
        pass

    def allgather(self, value):
        return [value]

    def bcast(self, value, root=0):
        return value


def _state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(64, 32, generator=g), "b": torch.zeros(32)},
        "samples": 640,
        "steps": 10,
        "rng": {"note": "plain data too"},
    }


def _wait(pred, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_listener_gets_what_the_stop_checkpoint_holds(tmp_path: Path) -> None:
    receiver = handover.Receiver(tmp_path, rank=0)
    record = tmp_path / handover.DIR / "0.json"
    assert record.stat().st_mode & 0o777 == 0o600
    assert set(json.loads(record.read_text())) == {"host", "port", "token"}
    path = save_checkpoint(tmp_path, _state(), 640, handover=True)
    _wait(lambda: receiver.got)
    found = agreed_latest(tmp_path, _World(), received=receiver)
    assert found is not None
    assert found[0] == path  # the file the sender wrote after sending
    on_disk = load(path)
    for key in ("w", "b"):
        assert torch.equal(found[1]["model"][key], on_disk["model"][key])
    assert found[1]["samples"] == on_disk["samples"] == 640
    assert not record.exists()  # the load closed the listener


def test_no_listener_means_only_the_file(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, _state(), 640, handover=True)
    assert checkpoints(tmp_path) == [path]
    assert not (tmp_path / handover.DIR).exists()


def test_a_state_that_does_not_fit_falls_back_to_the_files(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _state(1) | {"samples": 320}, 320)  # an older, fitting file
    receiver = handover.Receiver(tmp_path, rank=0)
    save_checkpoint(tmp_path, _state(), 640, handover=True)
    _wait(lambda: receiver.got)

    def check(state: dict) -> str | None:
        return "too new" if state["samples"] == 640 else None

    found = agreed_latest(tmp_path, _World(), check=check, received=receiver)
    assert found is not None and found[1]["samples"] == 320


def test_a_sender_without_the_token_is_ignored(tmp_path: Path) -> None:
    receiver = handover.Receiver(tmp_path, rank=0)
    try:
        record = json.loads((tmp_path / handover.DIR / "0.json").read_text())
        record["token"] = "0" * 32
        (tmp_path / handover.DIR / "0.json").write_text(json.dumps(record))
        # The listener does not prove it knows this token: the sender sends nothing.
        assert handover.offer(tmp_path, handover.serialise(_state())) == 0
        assert not receiver.got
    finally:
        receiver.close()


def test_a_port_taken_by_another_program_gets_no_state(tmp_path: Path) -> None:
    other = socket.create_server(("127.0.0.1", 0))
    got = bytearray()

    def serve() -> None:
        conn, _ = other.accept()
        with conn:
            while chunk := conn.recv(65536):
                got.extend(chunk)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    (tmp_path / handover.DIR).mkdir()
    record = {"host": socket.gethostname(), "port": other.getsockname()[1], "token": "a" * 32}
    (tmp_path / handover.DIR / "0.json").write_text(json.dumps(record))
    assert handover.offer(tmp_path, handover.serialise(_state())) == 0
    thread.join(timeout=30)
    other.close()
    assert bytes(got) == b""  # it never proved it knows the token


def test_a_listener_that_is_gone_costs_the_sender_only_the_file(tmp_path: Path) -> None:
    receiver = handover.Receiver(tmp_path, rank=0)
    record = (tmp_path / handover.DIR / "0.json").read_text()
    receiver.close()  # a successor that crashed: its record is left behind
    (tmp_path / handover.DIR / "0.json").write_text(record)
    path = save_checkpoint(tmp_path, _state(), 640, handover=True)
    assert load(path)["samples"] == 640


def test_a_listener_takes_nothing_from_a_sender_without_its_token(tmp_path: Path) -> None:
    receiver = handover.Receiver(tmp_path, rank=0)
    try:
        port = json.loads((tmp_path / handover.DIR / "0.json").read_text())["port"]
        data = handover.serialise(_state())
        with socket.create_connection(("127.0.0.1", port), 10) as conn:
            conn.recv(32)
            conn.sendall(handover._HEADER.pack(b"f" * 32, len(data)) + data)
        # The listener is still there for the real sender, which it then takes.
        assert handover.offer(tmp_path, data) == 1
        _wait(lambda: receiver.got)
        assert torch.equal(receiver.state["model"]["w"], _state()["model"]["w"])
    finally:
        receiver.close()


def test_auto_takes_the_state_over_the_network_only_on_a_network_file_system(
    tmp_path: Path,
) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/sda1 / ext4 rw 0 0\n"
        "fs:/home /home nfs4 rw 0 0\n"
        "lfs@tcp:/scratch /scratch\\040space lustre rw 0 0\n"
        "tmpfs /home/me/tmp tmpfs rw 0 0\n"
    )
    fs = handover.filesystem
    assert fs("/var/ckpt", str(mounts)) == "ext4"
    assert fs("/home/me/ckpt", str(mounts)) == "nfs4"
    assert fs("/home/me/tmp/ckpt", str(mounts)) == "tmpfs"  # the longest mount point wins
    assert fs("/scratch space/run", str(mounts)) == "lustre"
    assert fs("/homework", str(mounts)) == "ext4"  # a prefix of the name is not a parent
    assert handover.use_peer("peer", tmp_path) and not handover.use_peer("file", tmp_path)
    local = handover.filesystem(tmp_path) not in handover.NETWORK_FS
    assert handover.use_peer("auto", tmp_path) is not local
