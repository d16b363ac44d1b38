"""Sizing a pilot to the current holes: pure, shared by every backfill provider.

A hole is a node that is idle now and how long it stays free (None: no main job is planned
there). A pilot on k nodes lasts as long as the shortest-lived of them, so the candidates are
the k longest-lived holes; the best pilot covers the most node-seconds within the user's
bounds, more nodes on a tie (more workers now).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Hole", "PilotRequest", "size_pilot"]


@dataclass(frozen=True)
class Hole:
    """An idle node and how long it stays free (None: no pending job is planned on it)."""

    node: str
    state: str
    window_s: float | None
    blocking_job: str | None = None


@dataclass(frozen=True)
class PilotRequest:
    """What to ask the scheduler for: ``nodes`` nodes (``hosts``, longest-lived first) for
    ``walltime_s`` seconds."""

    nodes: int
    walltime_s: float
    hosts: tuple[str, ...]


def size_pilot(
    holes: Sequence[Hole],
    min_nodes: int,
    max_nodes: int,
    min_walltime_s: float,
    max_walltime_s: float,
    margin_s: float = 0.0,
    granularity_s: float = 0.0,
) -> PilotRequest | None:
    """The pilot covering the most node-seconds of ``holes``, or None if none is big enough.

    The walltime is the k-th longest window minus ``margin_s``, rounded down to
    ``granularity_s`` if given (Slurm counts whole minutes) and capped at ``max_walltime_s``; a
    pilot shorter than ``min_walltime_s`` or smaller than ``min_nodes`` is not worth asking for.
    """
    ranked = sorted(holes, key=lambda h: (h.window_s is not None, -(h.window_s or 0.0), h.node))
    best: tuple[float, int, float] | None = None
    for k in range(min_nodes, min(max_nodes, len(ranked)) + 1):
        window = ranked[k - 1].window_s
        wall = max_walltime_s if window is None else min(window - margin_s, max_walltime_s)
        if granularity_s > 0:
            wall = math.floor(wall / granularity_s + 1e-9) * granularity_s
        if wall < min_walltime_s:
            break  # windows only shrink with k
        if best is None or (k * wall, k) >= (best[0], best[1]):
            best = (k * wall, k, wall)
    if best is None:
        return None
    _, k, wall = best
    return PilotRequest(k, wall, tuple(h.node for h in ranked[:k]))
