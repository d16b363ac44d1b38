"""Progress reports of a fragment, and the profiler that learns scaling curves from them.

Rank 0 appends one JSON object per line to the report file: ``start`` (a run of the fragment at
world size ``world`` began; ``resume_s`` is the time from process start to the first step,
``stopped_at`` the wall time its predecessor stopped), ``step`` (samples/s over the last
interval, loss), ``eval``, ``shrunk`` and ``grown`` (the first step after an in-place
resize), ``stopped`` (checkpointed on a signal) and ``done`` (:class:`ReportEvent`). The
executor reads these, and :class:`ScalingProfiler` turns them into the allocator's scaling
curve and rescale cost.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import defaultdict
from enum import StrEnum
from pathlib import Path
from typing import Any

__all__ = [
    "ReportEvent",
    "ReportSink",
    "ReportTail",
    "ScalingProfiler",
    "read_reports",
    "spans_rate",
    "step_spans",
    "write_result",
]


class ReportEvent(StrEnum):
    """The ``event`` of a progress report's line: written by rank 0 of a fragment (the trainer
    and a task's own loop), read by the executor, the analysis of a run and the benchmarks."""

    START = "start"
    STEP = "step"
    EVAL = "eval"
    SHRUNK = "shrunk"
    GROWN = "grown"
    STOPPED = "stopped"
    DONE = "done"


class ReportSink:
    """Appends report lines to a file (one ``write`` per line, so readers see whole lines)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, event: ReportEvent | str, **fields: Any) -> None:
        """Append one line; ``event`` must be a :class:`ReportEvent` (ValueError otherwise)."""
        event = ReportEvent(event)
        if self.path is None:
            return
        line = json.dumps({"t": time.time(), "event": event, **fields}) + "\n"
        with self.path.open("a") as f:
            f.write(line)


def write_result(path: Path, outcome: dict[str, Any]) -> None:
    """Write a fragment's result file at once (a successor waiting on it never sees half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(outcome))
    tmp.replace(path)


def read_reports(path: str | Path) -> list[dict[str, Any]]:
    """All complete report lines of a file (a partly written last line is ignored)."""
    return ReportTail(path).read()


class ReportTail:
    """The reports appended to a file since the last :meth:`read`, for a reader that polls a
    growing file: it reads only the new bytes, and a partly written last line waits for the
    next call."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                if os.fstat(f.fileno()).st_size < self._offset:  # written anew
                    self._offset = 0
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # complete lines only
        self._offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a crash, followed by newer ones
                continue
        return out


def step_spans(reports: list[dict[str, Any]]) -> list[tuple[int, float, float, float]]:
    """(world, samples, seconds, start t) between each two consecutive ``step`` reports of one
    run of a fragment (any other report in between, or another world, ends the run). Summed,
    they give the rate a fragment sustains, periodic checkpoints and every slow step included,
    which the median of the reports' rates leaves out."""
    spans, prev = [], None
    for r in reports:
        if r["event"] != "step":
            prev = None
            continue
        if prev is not None and prev["world"] == r["world"] and r["t"] > prev["t"]:
            spans.append((int(r["world"]), r["samples"] - prev["samples"], r["t"] - prev["t"],
                          prev["t"]))  # fmt: skip
        prev = r
    return spans


def spans_rate(spans: list[tuple[float, float]]) -> float | None:
    """Samples/s over (samples, seconds) spans: Σ samples ÷ Σ seconds (None: no time)."""
    seconds = sum(s for _, s in spans)
    return sum(n for n, _ in spans) / seconds if seconds > 0 else None


class ScalingProfiler:
    """Scaling curve (median samples/s per world size), sustained rates and rescale cost from
    one fragment's (or task's) reports."""

    def __init__(self, reports: list[dict[str, Any]]) -> None:
        self.rates: dict[int, list[float]] = defaultdict(list)
        self.rescale_s: list[float] = []
        #: world → (samples, seconds) of each span between two step reports (:func:`step_spans`)
        self.spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for r in reports:
            if r["event"] == ReportEvent.STEP and r.get("rate"):
                self.rates[int(r["world"])].append(float(r["rate"]))
            elif r["event"] == ReportEvent.START and r.get("stopped_at"):
                self.rescale_s.append(float(r["first_step_at"]) - float(r["stopped_at"]))
        for world, samples, seconds, _ in step_spans(reports):
            self.spans[world].append((samples, seconds))

    def sustained(self, world: int) -> float | None:
        """Samples/s at ``world`` over all its spans: what training at that size yields per
        second, checkpoints included (None: no two step reports in a row at that size)."""
        return spans_rate(self.spans.get(world, []))

    def curve(self) -> tuple[list[int], list[float]]:
        """(node counts, samples/s) from 0, as a TaskSpec curve."""
        sizes = sorted(self.rates)
        return [0, *sizes], [0.0, *(statistics.median(self.rates[n]) for n in sizes)]

    def rescale_cost(self) -> float | None:
        """Median seconds from a fragment's stop to its first step at the new size."""
        return statistics.median(self.rescale_s) if self.rescale_s else None
