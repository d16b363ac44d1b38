"""The machine's other load while a benchmark runs: CPU used by processes that are not the
run's own, in cores. A run's processes are those whose environment carries its marker
(``NAME=value``, inherited by every process it starts, pilots in sessions of their own and
Slurm job steps included). Used by the executor benchmark (before and during each phase)
and by ``scripts/bench-quick.py`` (a figure flagged while others used the cores says more
about that load than about the code)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

#: Other processes using this many cores or more make a machine "loaded".
LOADED_CORES = 0.5


def marked(marker: str) -> list[int]:
    """PIDs of live processes (not this one) whose environment has ``marker``."""
    needle, me, found = marker.encode(), os.getpid(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ and state != "Z":
            found.append(int(proc.name))
    return found


class Load:
    """CPU used by processes other than this one and the ``marker`` ones, in cores, from
    creation to :meth:`others`. Marked processes are sampled every 0.5 s (one that lives less
    counts as other load: the figure errs towards "loaded")."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.cpu: dict[int, float] = {}  # pid → CPU seconds, last seen
        self.base = self._scan()
        self.start = self._machine()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    @staticmethod
    def _machine() -> tuple[float, float, float]:
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        busy = (sum(cpu) - cpu[3] - cpu[4]) / ticks  # all but idle and iowait
        t = os.times()
        return time.time(), busy, t.user + t.system

    def _scan(self) -> float:
        ticks = os.sysconf("SC_CLK_TCK")
        for pid in marked(self.marker):
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                self.cpu[pid] = (int(fields[11]) + int(fields[12])) / ticks
        return sum(self.cpu.values())

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            self._scan()

    def others(self) -> float:
        """Other processes' cores since creation (ends the sampling)."""
        self._stop.set()
        self._thread.join()
        ours = self._scan() - self.base
        (w0, b0, s0), (w1, b1, s1) = self.start, self._machine()
        return max(0.0, ((b1 - b0) - (s1 - s0) - ours) / max(1e-9, w1 - w0))


def wait_quiet(marker: str, max_wait: float, note, probe: float = 2.0) -> None:
    """Wait (up to ``max_wait`` s) until other processes use under :data:`LOADED_CORES`;
    ``note(message)`` says why it waits."""
    deadline = time.time() + max_wait
    while True:
        load = Load(marker)
        time.sleep(probe)
        if (others := load.others()) < LOADED_CORES:
            return
        if time.time() >= deadline:
            note(f"other processes still use {others:.2f} cores: measuring anyway")
            return
        note(f"other processes use {others:.2f} cores: waiting for a quieter machine")
