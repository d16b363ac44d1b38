"""Figures of one executor run, read off its event log and its tasks' progress reports.

The BackfillExecutor appends one JSON object a line to ``events.jsonl`` in its directory
(:class:`~parsl_bf.executor.events.EventLog`): ``pilot_up`` and ``pilot_gone`` bound a pilot's
life, ``fragment_start`` and ``fragment_stopped`` (or ``task_done``, ``task_failed``) a
fragment's, until its processes have exited; ``fragment_shrunk`` says that a fragment shrunk in
place holds fewer nodes from then on, and ``fragment_grow`` that one growing in place holds
more; ``fragment_stop`` says why a fragment was told to
stop, and ``decision`` how long an event took to become a plan applied. Each task's rank 0
writes ``tasks/<id>/progress.jsonl`` (:mod:`parsl_bf.training.reports`).

:func:`run_figures` turns both, parsed, into the figures of a span [t0, t_end] of wall time:
samples, allocated and held node-seconds, lost samples, preemptions, start-up and rescale
costs, decision latencies. :func:`efficiency` is the accounting of ``docs/replay.md``
("Accounting") on them, so that a real run and the replay of its window compare. Everything
here is a pure function of the parsed lines but :func:`load_run`, which reads them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..training.reports import ReportEvent, read_reports, spans_rate, step_spans
from .lifecycle import LogEvent

__all__ = [
    "PREEMPTING",
    "RESCALES",
    "RunFigures",
    "efficiency",
    "load_run",
    "node_time",
    "node_time_series",
    "percentile",
    "rescale_times",
    "run_figures",
]

Event = Mapping[str, Any]

#: ``fragment_stop`` reasons that are preemptions: the fragment's pilot ended or was taken back.
PREEMPTING = frozenset({"walltime", "preempted", "pilot gone"})
#: Events after which a fragment's processes have exited (its nodes are free again): one
#: fragment's, and (the second) all of a task's.
_FRAGMENT_ENDED = (LogEvent.FRAGMENT_STOPPED, LogEvent.FRAGMENT_FAILED, LogEvent.FRAGMENT_LOST)
#: Rescale kinds of :attr:`RunFigures.rescale_s`: the command's event and the progress report
#: of its first step at the new size.
RESCALES = {
    "grow_in_place": (LogEvent.FRAGMENT_GROW, ReportEvent.GROWN),
    "shrink_in_place": (LogEvent.FRAGMENT_SHRINK, ReportEvent.SHRUNK),
    "handover": (LogEvent.FRAGMENT_START, ReportEvent.START),  # with ``after``: a warm successor
}
_TASK_ENDED = (LogEvent.TASK_DONE, LogEvent.TASK_FAILED)


@dataclass
class RunFigures:
    """What one run did in [t0, t_end]; node-seconds are wall seconds."""

    samples: int = 0  # Σ over tasks of the samples of the last report by t_end
    per_task: dict[str, int] = field(default_factory=dict)  # task → those samples
    alloc_node_s: float = 0.0  # tasks' nodes × (fragment start → its processes exited)
    held_node_s: float = 0.0  # pilots' nodes × (pilot_up → pilot_gone)
    fragments: int = 0  # fragment starts by t_end
    pilots: int = 0  # pilots up by t_end
    preemptions: int = 0  # fragments told to stop by t_end because their pilot left
    #: Samples done twice: per ``start`` report after a task's first, the most samples reported
    #: before it less (its samples − one global batch), if positive. A first step at an epoch's
    #: end is shorter than a batch, so this may count up to a batch less one too many.
    lost: int = 0
    decisions: list[float] = field(default_factory=list)  # seconds, every decision event
    startup_s: list[float] = field(default_factory=list)  # fragment_start → its first step
    waited_s: list[float] = field(default_factory=list)  # predecessor's stop → first step
    #: The two costs the replay charges, as the real run paid them: a start on nodes the task
    #: did not hold (``fragment_start`` with no ``after`` → first step: a first start, a
    #: restart after preemption or failure), and a warm rescale's hand-over (the predecessor's
    #: stop → the successor's first step, successors with ``after`` only: a restart's stop →
    #: first step also counts the time the task had no node).
    fresh_startup_s: list[float] = field(default_factory=list)
    handover_s: list[float] = field(default_factory=list)
    #: A rescale from the controller's decision to the first step at the new size, through
    #: the executor, the channel, the agent and the ranks: from the command's event (written
    #: as the decision is carried out: ``fragment_grow``, ``fragment_shrink`` in place, or a
    #: ``fragment_start`` with ``after``, a hand-over) to the task's next ``grown``,
    #: ``shrunk`` or ``start`` report's ``first_step_at``; by :data:`RESCALES` kind, decisions
    #: in [t0, t_end] whose first step came by t_end.
    rescale_s: dict[str, list[float]] = field(default_factory=dict)
    rates1: list[float] = field(default_factory=list)  # samples/s of 1-rank steps from t0
    #: (samples, seconds) between consecutive 1-rank step reports from t0 (``step_spans``)
    spans1: list[tuple[float, float]] = field(default_factory=list)

    @property
    def sustained1(self) -> float | None:
        """Samples/s that 1-rank fragments sustained, checkpoints included (None: no span)."""
        return spans_rate(self.spans1)


def run_figures(
    events: Iterable[Event],
    reports: Mapping[str, Sequence[Event]],
    t0: float,
    t_end: float,
    batch: int,
) -> RunFigures:
    """The figures of a run over [t0, t_end] from its ``events`` (in order) and each task's
    progress ``reports`` (task → its reports, in order); ``batch``: the global batch size.

    A fragment holds its nodes from its ``fragment_start`` until its processes have exited:
    its ``fragment_stopped``, ``fragment_failed`` (restarted) or ``fragment_lost`` (that
    generation's; in logs that name none, the task's oldest fragment), its task's
    ``task_done`` or ``task_failed``, or the task's next cold start (a ``fragment_start`` with
    no ``after``) at the latest. While a warm successor (``after``: its predecessor's
    generation) and its predecessor both run, the task holds the larger of their node counts:
    a task that grows or shrinks keeps its nodes (``parsl_bf.allocation.plan``), so one's
    nodes contain the other's (a move to other nodes is undercounted while both run).
    Intervals still open at t_end (a fragment running, a pilot up) count up to t_end; every
    interval is clipped to [t0, t_end]. A decision counts whenever it happened.
    """
    res = RunFigures()
    running: dict[str, dict[int, int]] = {}  # task → generation → nodes, of running fragments
    changed: dict[str, float] = {}  # task → when its node count last changed
    launched: dict[str, list[tuple[float, bool]]] = {}  # task → (fragment_start t, warm)
    pilots: dict[str, tuple[float, int]] = {}  # pilot → (up, nodes)

    def account(task: str, t: float) -> dict[int, int]:
        """Adds the task's node-seconds up to ``t``; its running fragments."""
        frags = running.setdefault(task, {})
        held = max(frags.values(), default=0)
        res.alloc_node_s += held * _overlap(changed.get(task, t), t, t0, t_end)
        changed[task] = t
        return frags

    for e in events:
        kind, t = e["event"], float(e["t"])
        if kind == LogEvent.FRAGMENT_START:
            starts = launched.setdefault(e["task"], [])
            after = e.get("after")
            frags = {g: n for g, n in account(e["task"], t).items() if g == after}
            frags[int(e.get("generation", len(starts)))] = int(e["nodes"])
            running[e["task"]] = frags
            starts.append((t, after is not None))
            res.fragments += t <= t_end
        elif kind in _TASK_ENDED and e.get("task") in running:
            account(e["task"], t).clear()
        elif kind in (LogEvent.FRAGMENT_SHRUNK, LogEvent.FRAGMENT_GROW) and running.get(e["task"]):
            # Shrunk in place: the ranks given back have left, their nodes are free. Grown in
            # place: the joiners' nodes are the fragment's from the decision on.
            frags = account(e["task"], t)
            gen = e.get("generation")
            frags[gen if gen in frags else max(frags)] = int(e["nodes"])
        elif kind in _FRAGMENT_ENDED and running.get(e["task"]):
            frags, gen = account(e["task"], t), e.get("generation")
            del frags[gen if gen in frags else min(frags)]
        elif kind == LogEvent.PILOT_UP:
            pilots[e["pilot"]] = (t, len(e["nodes"]))
            res.pilots += t <= t_end
        elif kind == LogEvent.PILOT_GONE and e["pilot"] in pilots:
            start, n = pilots.pop(e["pilot"])
            res.held_node_s += n * _overlap(start, t, t0, t_end)
        elif kind == LogEvent.FRAGMENT_STOP and e.get("reason") in PREEMPTING and t <= t_end:
            res.preemptions += 1
        elif kind == LogEvent.DECISION:
            res.decisions.append(float(e["seconds"]))
    for task in running:
        account(task, t_end)
    res.held_node_s += sum(n * _overlap(s, t_end, t0, t_end) for s, n in pilots.values())
    for task in sorted(reports):
        done = _task(res, reports[task], launched.get(task, []), t0, t_end, batch)
        res.per_task[task] = done
        res.samples += done
    res.rescale_s = rescale_times(events, reports, t0, t_end)
    return res


def rescale_times(
    events: Iterable[Event], reports: Mapping[str, Sequence[Event]], t0: float, t_end: float
) -> dict[str, list[float]]:
    """Seconds from each rescale decision in [t0, t_end] to its first step at the new size
    (:attr:`RunFigures.rescale_s`), by kind. A decision that never got its step by t_end (the
    task was stopped or preempted first) is left out."""
    kinds = {command: (kind, report) for kind, (command, report) in RESCALES.items()}
    out: dict[str, list[float]] = {kind: [] for kind in RESCALES}
    for e in events:
        found = kinds.get(e["event"])
        t = float(e["t"])
        if found is None or not t0 <= t <= t_end or e.get("task") not in reports:
            continue
        if e["event"] == LogEvent.FRAGMENT_START and e.get("after") is None:
            continue  # a start on nodes the task did not hold: not a rescale
        kind, report = found
        first = next(
            (r["first_step_at"] for r in reports[e["task"]]
             if r["event"] == report and r.get("first_step_at", 0) >= t),
            None,
        )  # fmt: skip
        if first is not None and first <= t_end:
            out[kind].append(first - t)
    return out


def _task(
    res: RunFigures,
    reports: Sequence[Event],
    launched: Sequence[tuple[float, bool]],
    t0: float,
    t_end: float,
    batch: int,
) -> int:
    """Adds one task's lost samples and costs to ``res``; its samples by t_end."""
    kept = [r for r in reports if r["t"] <= t_end and "samples" in r]
    best = 0
    for r in kept:
        if r["event"] == ReportEvent.START:
            if best:
                res.lost += max(0, best - (r["samples"] - batch))
            before = [(t, warm) for t, warm in launched if t <= r["first_step_at"]]
            warm = bool(before) and before[-1][1]
            if before:
                res.startup_s.append(r["first_step_at"] - before[-1][0])
                if not warm:
                    res.fresh_startup_s.append(res.startup_s[-1])
            if r.get("stopped_at"):
                res.waited_s.append(r["first_step_at"] - r["stopped_at"])
                if warm:
                    res.handover_s.append(res.waited_s[-1])
        best = max(best, r["samples"])
        if r["event"] == ReportEvent.STEP and r["world"] == 1 and r.get("rate") and r["t"] >= t0:
            res.rates1.append(r["rate"])
    res.spans1 += [(n, dt) for world, n, dt, t in step_spans(kept) if world == 1 and t >= t0]
    return kept[-1]["samples"] if kept else 0


Span = tuple[float, float, int]  # (from, to, nodes)


def _rank_spans(
    events: Sequence[Event], reports: Mapping[str, Sequence[Event]]
) -> tuple[list[Span], list[Span]]:
    """The ranks' training spans (between two step reports) and start-up spans (fragment
    start → its first step), each with its nodes."""
    starts: dict[str, list[float]] = {}
    for e in events:
        if e["event"] == LogEvent.FRAGMENT_START:
            starts.setdefault(e["task"], []).append(float(e["t"]))
    training: list[Span] = []
    start_up: list[Span] = []
    for task, lines in reports.items():
        training += [(t, t + dt, w) for w, _, dt, t in step_spans(list(lines))]
        for r in lines:
            if r["event"] == ReportEvent.START and r.get("first_step_at"):
                before = [t for t in starts.get(task, []) if t <= r["first_step_at"]]
                if before:
                    start_up.append((before[-1], r["first_step_at"], int(r.get("world", 1))))
    return training, start_up


def node_time(events: Sequence[Event], reports: Mapping[str, Sequence[Event]]) -> dict[str, float]:
    """Where a whole run's pilot node-seconds went (wall seconds, events in order):
    ``offered`` (pilots up), ``training`` (ranks between step reports), ``start_up``
    (fragment start → its first step, its ranks' nodes: process and pilot start-up, loading
    the checkpoint), ``other_held`` (the rest of the tasks' time: hand-overs, stops and
    checkpoints on preemption, evaluations) and ``no_work`` (pilot nodes no task held)."""
    if not events:
        return {}
    t0, t_end = float(events[0]["t"]), float(events[-1]["t"])
    fig = run_figures(events, reports, t0, t_end, batch=0)
    spans = _rank_spans(events, reports)
    training, start_up = (sum(n * (b - a) for a, b, n in part) for part in spans)
    training = min(training, fig.alloc_node_s)
    start_up = min(start_up, fig.alloc_node_s - training)
    return {
        "offered": fig.held_node_s,
        "training": training,
        "start_up": start_up,
        "other_held": fig.alloc_node_s - training - start_up,
        "no_work": max(0.0, fig.held_node_s - fig.alloc_node_s),
    }


def node_time_series(
    events: Sequence[Event], reports: Mapping[str, Sequence[Event]], times: Sequence[float]
) -> dict[str, list[float]]:
    """At each of ``times`` (epoch seconds): ``offered`` (nodes of pilots up), ``training``
    (ranks inside a span between two step reports) and ``start_up`` (ranks between their
    fragment's start and its first step): :func:`node_time` over time, for the timeline."""
    pilots: list[Span] = []
    up: dict[str, tuple[float, int]] = {}
    for e in events:
        if e["event"] == LogEvent.PILOT_UP:
            up[e["pilot"]] = (float(e["t"]), len(e["nodes"]))
        elif e["event"] == LogEvent.PILOT_GONE and e["pilot"] in up:
            began, n = up.pop(e["pilot"])
            pilots.append((began, float(e["t"]), n))
    end = float(events[-1]["t"]) if events else 0.0
    pilots += [(began, end, n) for began, n in up.values()]
    training, start_up = _rank_spans(events, reports)

    def at(spans: list[Span], t: float) -> float:
        return float(sum(n for a, b, n in spans if a <= t < b))

    return {
        "offered": [at(pilots, t) for t in times],
        "training": [at(training, t) for t in times],
        "start_up": [at(start_up, t) for t in times],
    }


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    """Length of [a, b] ∩ [lo, hi]."""
    return max(0.0, min(b, hi) - max(a, lo))


def efficiency(
    samples: float, p1: float, alloc_node_s: float, idle_node_s: float
) -> dict[str, float]:
    """``util`` = allocated ÷ idle node-seconds, ``E_used`` = samples / P(1) ÷ allocated
    node-seconds (0 when nothing was allocated), ``E_avail`` = samples / P(1) ÷ idle
    node-seconds: ``docs/replay.md`` ("Accounting"); ``p1``: one node's samples/s."""
    norm = samples / p1
    return {
        "util": alloc_node_s / idle_node_s,
        "E_used": norm / alloc_node_s if alloc_node_s else 0.0,
        "E_avail": norm / idle_node_s,
    }


def percentile(xs: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``xs``, interpolated linearly between the closest
    ranks (numpy's default); None for no values."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def load_run(directory: str | Path) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """An executor directory's events and each task's progress reports (task id → reports),
    as :func:`run_figures` takes them; a partly written last line is left out."""
    directory = Path(directory)
    events = read_reports(directory / "events.jsonl")
    reports = {
        p.parent.name: read_reports(p) for p in sorted(directory.glob("tasks/*/progress.jsonl"))
    }
    return events, reports
