"""The rank relay's protocol with real processes (no ``mpiexec``: its PMI environment is set
here as Hydra would set it): what it says when ready, the signals it forwards, the exit code it
takes, and its death when the connection ends without one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from parsl_bf.pilot import relay

from ..waiting import until


def _start(tmp_path: Path) -> tuple[subprocess.Popen, socket.socket, dict]:
    path = str(tmp_path / "pool.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    env = {"PATH": os.environ.get("PATH", ""), "PMI_PORT": "host:1234", "PMI_ID": "0"}
    env |= {"MPI_LOCALRANKID": "0", "UNRELATED": "x"}
    argv = [sys.executable, "-I", "-S", relay.__file__, "--connect", path, "--token", "7"]
    proc = subprocess.Popen(argv, env=env)
    conn, _ = listener.accept()
    listener.close()
    said = json.loads(conn.makefile("rb").readline())
    return proc, conn, said


def test_a_relay_says_its_job_s_pmi_address_and_exits_with_the_rank_s_code(tmp_path) -> None:
    proc, conn, said = _start(tmp_path)
    assert said["ready"] == proc.pid and said["token"] == 7
    assert said["pmi"] == {"PMI_PORT": "host:1234", "PMI_ID": "0", "MPI_LOCALRANKID": "0"}
    conn.sendall(b'{"code": 3}\n')
    assert proc.wait(30) == 3


def test_a_relay_forwards_a_preemption_s_signals_to_its_rank(tmp_path) -> None:
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc, conn, _ = _start(tmp_path)
    try:
        proc.send_signal(signal.SIGTERM)  # before the rank is known: held, then forwarded
        conn.sendall(json.dumps({"pid": rank.pid}).encode() + b"\n")
        assert rank.wait(30) == -signal.SIGTERM
        assert proc.poll() is None  # the relay itself ignores it
        conn.sendall(b'{"code": 0}\n')
        assert proc.wait(30) == 0
    finally:
        rank.kill()


def test_a_relay_whose_rank_is_gone_without_a_word_is_killed(tmp_path) -> None:
    proc, conn, _ = _start(tmp_path)
    conn.close()
    until(lambda: proc.poll() is not None, 30, "the relay outlived its connection")
    assert proc.returncode == -signal.SIGKILL
