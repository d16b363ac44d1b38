"""Real pilot agents on a real channel, for the agent and channel tests: what a server
reported, a pilot's environment, a launch message, and whether a process still runs. The
fixtures ``secret_file``, ``serve`` and ``agent`` that use them are in ``conftest.py``."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from parsl_bf import environment
from parsl_bf.pilot.wire import AGENT_MODULE, Refused

from ..waiting import until

ROOT = Path(__file__).resolve().parents[2]
END = 1_900_000_000.5  # the pilots' walltime end (epoch seconds)
AGENT = [sys.executable, "-m", AGENT_MODULE]


class Events:
    """What a server reported, in order, with the monotonic time each arrived (appended from
    the server's thread)."""

    def __init__(self) -> None:
        self.items: list[object] = []
        self.arrived: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, event: object) -> None:
        with self._lock:
            self.items.append(event)
            self.arrived.append(time.monotonic())

    def of(self, kind: type) -> list:
        with self._lock:
            return [e for e in self.items if isinstance(e, kind)]

    def timed(self, kind: type) -> list[tuple[float, object]]:
        with self._lock:
            return [
                (t, e) for t, e in zip(self.arrived, self.items, strict=True) if isinstance(e, kind)
            ]

    def reasons(self) -> set[str]:
        return {e.reason for e in self.of(Refused)}

    def wait(self, expected: object, timeout: float = 10.0) -> int:
        """Wait for an event equal to ``expected``; its index in :attr:`items`."""
        until(lambda: expected in self.items, timeout, f"no {expected!r} in {self.items!r}")
        return self.items.index(expected)


def pilot_env(pilot: str) -> dict[str, str]:
    """The environment a pilot's job script gives its agent: two CPU nodes (whatever GPUs this
    machine has), ending at ``END``."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        environment.PILOT_JOB_ID: pilot,
        environment.PILOT_NODES: "n0,n1",
        environment.PILOT_END: str(END),
        environment.VISIBLE_GPUS: "",
    }


def launch(key: str, argv: list[str], out: Path, **kw) -> dict:
    """The channel's ``launch`` message, the process's streams in ``out``."""
    return {
        "op": "launch",
        "key": key,
        "argv": argv,
        "env": kw.get("env", {}),
        "cwd": kw.get("cwd"),
        "stdout": str(out / f"{key}.out"),
        "stderr": str(out / f"{key}.err"),
    }


def alive(pid: int) -> bool:
    """Running, not a zombie (a container's init may not reap the orphans it inherits)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False
