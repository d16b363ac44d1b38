"""Windows of an idle-node trace: which consecutive nodes and which span of trace time to
replay or emulate, so that a short run still sees the events an allocator reacts to.

:func:`choose_window` picks, among the windows of ``nodes`` consecutive nodes (as
``load_trace``'s ``node_offset`` takes them) whose idle pieces are long enough and that are
idle enough, the busiest one: the most distinct times at which one of its nodes changes state.
A window is played in ``duration_s`` wall seconds, so its ``time_scale`` (trace seconds per
wall second) is its length over that duration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..inputs.trace import IdleTrace

__all__ = ["Window", "choose_window", "idle_intervals"]

Pieces = tuple[tuple[tuple[float, float], ...], ...]


@dataclass(frozen=True)
class Window:
    """``nodes`` nodes from ``node_offset``, trace seconds [start_s, start_s + length_s],
    played in ``duration_s`` wall seconds."""

    node_offset: int
    nodes: int
    start_s: int
    length_s: int
    duration_s: float
    changes: int  # state changes inside the window, over all its nodes
    pieces: Pieces  # per node: its idle pieces (a, b) clipped to the window, trace seconds

    @property
    def time_scale(self) -> float:
        """Trace seconds per wall second."""
        return self.length_s / self.duration_s

    @property
    def end_s(self) -> int:
        return self.start_s + self.length_s

    def wall(self, t: float) -> float:
        """Wall seconds after the window's start at trace second ``t``."""
        return (t - self.start_s) / self.time_scale

    @property
    def idle_node_s(self) -> float:
        """Idle node-seconds of the window, in wall seconds."""
        return sum(b - a for p in self.pieces for a, b in p) / self.time_scale

    def holes_wall(self) -> list[float]:
        """Every idle piece's length, in wall seconds."""
        return [(b - a) / self.time_scale for p in self.pieces for a, b in p]

    def describe(self, names: Sequence[str]) -> str:
        """One line a node: its idle pieces in wall seconds from the window's start."""
        lines = []
        for name, p in zip(names, self.pieces, strict=True):
            holes = ", ".join(f"{self.wall(a):.0f}-{self.wall(b):.0f}" for a, b in p)
            lines.append(f"  {name}: idle {holes or 'never'} s")
        return "\n".join(lines)


def idle_intervals(trace: IdleTrace) -> list[np.ndarray]:
    """Per node of ``trace``: its idle intervals (a, b) in trace seconds, an (n, 2) array; a
    node still idle at the trace's end is idle until ``trace.end_s``."""
    out = []
    for i in range(len(trace.nodes)):
        m = trace.change_node == i
        start = 0 if trace.initial[i] else None
        rows = []
        for t, idle in zip(trace.change_t[m].tolist(), trace.change_idle[m].tolist(), strict=True):
            if idle and start is None:
                start = t
            elif not idle and start is not None:
                rows.append((start, t))
                start = None
        if start is not None:
            rows.append((start, trace.end_s))
        out.append(np.array(rows, dtype=float).reshape(-1, 2))
    return out


def choose_window(
    trace: IdleTrace,
    nodes: int,
    duration_s: float,
    min_hole_s: float,
    min_idle: float = 0.4,
    lengths: Sequence[int] | None = None,
) -> Window:
    """The busiest window of ``nodes`` consecutive nodes of ``trace``.

    Candidates: every node offset; lengths ``lengths`` trace seconds (by default 30 from
    2× to 100× ``duration_s``, geometrically spaced); starts one trace second before one of
    the window's nodes changes state. A candidate qualifies when each idle piece (a hole
    clipped to the window) lasts at least ``min_hole_s`` wall seconds (holes too short to start
    anything in would measure start-up, not allocation) and at least ``min_idle`` of its
    node-seconds are idle. Of those, the one with the most distinct change times inside it;
    ties: more changes, then a larger idle fraction, then the shorter, then the first found
    (lowest offset, earliest start). Raises ValueError when none qualifies.
    """
    intervals = idle_intervals(trace)
    if lengths is None:
        spaced = np.geomspace(2 * duration_s, 100 * duration_s, 30)
        lengths = np.unique(np.round(spaced).astype(int)).tolist()
    best: tuple | None = None
    for offset in range(len(trace.nodes) - nodes + 1):
        group = intervals[offset : offset + nodes]
        starts = np.unique(np.concatenate([g.ravel() for g in group])) - 1
        starts = starts[starts >= 0]
        for length in sorted(int(x) for x in lengths):
            scale = length / duration_s
            for s in starts.tolist():
                e = s + length
                if e > trace.end_s:
                    break
                found = _pieces(group, s, e, min_hole_s * scale)
                if found is None:
                    continue
                pieces, times, changes = found
                idle = sum(b - a for p in pieces for a, b in p)
                if idle < min_idle * nodes * length:
                    continue
                key = (len(times), changes, idle / (nodes * length), -length)
                if best is None or key > best[0]:
                    best = (key, offset, int(s), length, pieces)
    if best is None:
        raise ValueError(
            f"no window of {nodes} nodes with idle pieces of {min_hole_s:g} wall s or more "
            f"and {min_idle:.0%} idle"
        )
    (_, changes, _, _), offset, s, length, pieces = best
    return Window(offset, nodes, s, length, duration_s, changes, pieces)


def _pieces(
    group: list[np.ndarray], s: float, e: float, min_piece: float
) -> tuple[Pieces, set[float], int] | None:
    """The nodes' idle pieces clipped to [s, e], the distinct change times strictly inside
    and their count over the nodes; None if a piece is shorter than ``min_piece``."""
    pieces, times, changes = [], set(), 0
    for g in group:
        a, b = np.clip(g[:, 0], s, e), np.clip(g[:, 1], s, e)
        keep = b > a
        a, b = a[keep], b[keep]
        if len(a) and (b - a).min() < min_piece:
            return None
        inside = [t for t in (*a.tolist(), *b.tolist()) if s < t < e]
        changes += len(inside)
        times.update(inside)
        pieces.append(tuple(zip(a.tolist(), b.tolist(), strict=True)))
    return tuple(pieces), times, changes
