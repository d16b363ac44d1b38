"""The live progress of a ``parsl-bf run``.

A thread looks at the run every ~2 s: the DataFlowKernel's task counts, the providers' pilots
and, with an executor that writes its own status snapshots (a BackfillExecutor), those
snapshots: nodes in use and idle, samples/s, preemptions. Shown live on a terminal (a rich
``Live``), as log lines otherwise; every look is kept as a :class:`~parsl_bf.report.Sample`
for the report's timeline.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any

from ..decisions import PilotEnd
from ..report import Sample, group_counts

__all__ = ["PERIOD_S", "Progress", "pilot_ends", "provider_preemptions", "writes_status"]

PERIOD_S = 2.0


def writes_status(executor: Any) -> bool:
    """Whether the executor writes its own ``status.json`` with its tasks (a BackfillExecutor).

    Asked through the executor's ``writes_status`` class attribute, the same flag by which
    :class:`~parsl_bf.providers.BackfillErrorHandler` leaves the writing to such an executor:
    it names the capability the progress thread relies on rather than a class, so it holds for
    subclasses and stand-ins, and needs no import of the executor machinery (ZeroMQ, ...) for a
    config that has none. ``is True``, so that a mock's attribute does not count.
    """
    return getattr(executor, "writes_status", False) is True


def _pilots(config: Any) -> list[Any]:
    """Every pilot the config's providers record (those with a ``pilots`` dict)."""
    found = []
    for executor in config.executors:
        pilots = getattr(getattr(executor, "provider", None), "pilots", None)
        if isinstance(pilots, dict):
            with contextlib.suppress(RuntimeError):  # changed while we copied: next time
                found += list(pilots.values())
    return found


def provider_preemptions(config: Any) -> int:
    return sum(1 for p in _pilots(config) if getattr(p, "reason", "") == PilotEnd.PREEMPTED)


def pilot_ends(config: Any) -> dict[str, int] | None:
    """The providers' pilots by how they ended ("preempted", "walltime", ...) or their state."""
    if not any(
        isinstance(getattr(getattr(e, "provider", None), "pilots", None), dict)
        for e in config.executors
    ):
        return None
    counts: dict[str, int] = {}
    for p in _pilots(config):
        why = getattr(p, "reason", "") or getattr(getattr(p, "state", None), "name", "?").lower()
        counts[why] = counts.get(why, 0) + 1
    return counts


def _snapshots(run_dir: str | None) -> list[dict[str, Any]]:
    if run_dir is None:
        return []
    from ..executor.events import read_status

    try:
        return read_status(run_dir)
    except (OSError, ValueError):  # being rewritten (atomically, but the glob may race)
        return []


class Progress(threading.Thread):
    """Samples the run every ``period`` seconds; shows it live or as log lines."""

    def __init__(self, config: Any, live: bool, period: float = PERIOD_S) -> None:
        super().__init__(name="parsl-bf-progress", daemon=True)
        self.config, self.live, self.period = config, live, period
        self.backfill = sum(1 for e in config.executors if writes_status(e))
        self._status_paths: list[str] = []  # found once by read_status, then read directly
        self._status_run: str | None = None
        self.start_time = time.monotonic()
        self.dfks: list[Any] = []
        self.samples: list[Sample] = []
        self._stop_event = threading.Event()
        self.display: Any = None  # a rich Live, when live
        self._last_line = ""
        self._last_print = 0.0

    # The DFK appears once the workflow has loaded the config: look for it often until then.
    def _find_dfk(self) -> Any:
        import parsl

        try:
            dfk = parsl.dfk()
        except Exception:  # none loaded (yet, or any more)
            return None
        if not any(d is dfk for d in self.dfks):
            self.dfks.append(dfk)
        return dfk

    @property
    def run_dirs(self) -> list[str]:
        return [d.run_dir for d in self.dfks]

    def snapshots(self) -> list[dict[str, Any]]:
        """The status snapshots of the current run, when an executor writes its own."""
        if not self.backfill or not self.dfks:
            return []
        run_dir = self.dfks[-1].run_dir
        if run_dir != self._status_run or len(self._status_paths) < self.backfill:
            found = _snapshots(run_dir)
            self._status_run, self._status_paths = run_dir, [f["path"] for f in found]
            return found
        out = []
        for path in self._status_paths:
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(Path(path).read_text()) | {"path": path})
        return out

    def sample(self) -> Sample:
        s = Sample(t=round(time.monotonic() - self.start_time, 1))
        for dfk in self.dfks:
            with dfk.task_state_counts_lock:
                counts = dict(dfk.task_state_counts)
            for group, n in group_counts(counts).items():
                setattr(s, group, getattr(s, group) + n)
        from parsl.jobs.states import JobState

        running = [p for p in _pilots(self.config) if p.state is JobState.RUNNING]
        s.pilots, s.pilot_nodes = len(running), sum(len(p.nodes) for p in running)
        snapshots = self.snapshots()
        if snapshots:
            held = sum(
                len(p.get("nodes", [])) for snap in snapshots for p in snap.get("pilots", [])
            )
            tasks = [t for snap in snapshots for t in snap.get("tasks", [])]
            s.in_use = sum(t.get("nodes") or 0 for t in tasks)
            s.idle = max(0, held - s.in_use)
            s.rate = round(sum(t.get("rate") or 0.0 for t in tasks), 1)
            s.preemptions = sum(snap.get("preemptions") or 0 for snap in snapshots)
        return s

    def run(self) -> None:
        while not self._stop_event.is_set():
            dfk = self._find_dfk()
            if self.dfks:
                self._record()
            self._stop_event.wait(self.period if dfk is not None else 0.1)

    def _record(self) -> None:
        try:
            s = self.sample()
        except Exception:  # never let a look at the run break it
            return
        self.samples.append(s)
        self._show(s)

    def _show(self, s: Sample) -> None:
        if self.live:
            if self.display is not None:
                self.display.update(_live_view(s), refresh=True)
            return
        line = _line(s)
        now = time.monotonic()
        if line != self._last_line or now - self._last_print >= 30:
            print(f"[parsl-bf {s.t:6.0f}s] {line}", flush=True)
            self._last_line, self._last_print = line, now

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=10)
        self._find_dfk()
        if self.dfks:
            self._record()  # the final counts


def _line(s: Sample) -> str:
    parts = [f"tasks {s.done} done, {s.running} running, {s.queued} queued, {s.failed} failed"]
    if s.pilots or s.pilot_nodes:
        parts.append(f"pilots {s.pilots} ({s.pilot_nodes} nodes)")
    if s.in_use is not None:
        parts.append(f"nodes {s.in_use} in use, {s.idle} idle, {s.rate} samples/s")
    if s.preemptions:
        parts.append(f"preemptions {s.preemptions}")
    return " | ".join(parts)


def _live_view(s: Sample) -> Any:
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_row("[bold]elapsed[/]", f"{s.t:.0f} s")
    table.add_row(
        "[bold]tasks[/]",
        f"[green]{s.done} done[/]  [cyan]{s.running} running[/]  {s.queued} queued  "
        f"[red]{s.failed} failed[/]",
    )
    table.add_row("[bold]pilots[/]", f"{s.pilots} running, {s.pilot_nodes} nodes")
    if s.in_use is not None:
        table.add_row("[bold]nodes[/]", f"{s.in_use} in use, {s.idle} idle; {s.rate} samples/s")
        table.add_row("[bold]preemptions[/]", str(s.preemptions))
    return table
