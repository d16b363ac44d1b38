"""Sizing a pilot to the current holes: pure, shared by every backfill provider.

A hole is a node that is idle now and how long it stays free (None: no main job is planned
there). A pilot on k nodes lasts as long as the shortest-lived of them, so the candidates are
the k longest-lived holes; the best pilot covers the most node-seconds within the user's
bounds, more nodes on a tie (more workers now).

A scheduler with backfill sizing of its own (Slurm: ``--nodes=min-max``, ``--time-min``) can
be left part of the choice (:func:`sizing_request`): a request then carries the lower bounds
the scheduler may start it at, and the pilot learns its real size and end from its allocation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, get_args

__all__ = ["SIZINGS", "Hole", "PilotRequest", "Sizing", "size_pilot", "sizing_request"]

#: Who sizes a pilot: ``provider``: we do, from the holes (a fixed node count and walltime);
#: ``scheduler``: the scheduler does, at the moment a size fits (a node range and a walltime
#: range, submitted without looking at the holes); ``hybrid``: our walltime and node count as
#: the upper bound, the scheduler may start it on fewer nodes (down to ``min_nodes``).
Sizing = Literal["provider", "scheduler", "hybrid"]
SIZINGS: tuple[str, ...] = get_args(Sizing)


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
    #: The scheduler may start it on fewer nodes, down to this many (None: exactly ``nodes``).
    min_nodes: int | None = None
    #: The scheduler may shorten its walltime, down to this (None: exactly ``walltime_s``).
    min_walltime_s: float | None = None

    @property
    def fewest_nodes(self) -> int:
        """The fewest nodes the scheduler may start it on."""
        return self.nodes if self.min_nodes is None else min(self.min_nodes, self.nodes)

    @property
    def shortest_s(self) -> float:
        """The shortest walltime the scheduler may grant."""
        return self.walltime_s if self.min_walltime_s is None else self.min_walltime_s

    @property
    def sized_to_hole(self) -> bool:
        """Sized to holes seen now (a pilot that waits too long for them missed them)."""
        return bool(self.hosts)


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


def sizing_request(
    sizing: Sizing,
    holes: Sequence[Hole],
    min_nodes: int,
    max_nodes: int,
    min_walltime_s: float,
    max_walltime_s: float,
    margin_s: float = 0.0,
    granularity_s: float = 0.0,
) -> PilotRequest | None:
    """The request of one pilot under ``sizing`` (see :data:`Sizing`); None: no hole fits yet.

    ``scheduler`` ignores ``holes``: the whole range goes to the scheduler, which starts the
    pilot when any size in it fits (Slurm's backfill shortens the walltime, down to the
    minimum, only if that lets it start earlier).
    """
    if sizing == "scheduler":
        return PilotRequest(max_nodes, max_walltime_s, (), min_nodes, min_walltime_s)
    request = size_pilot(
        holes, min_nodes, max_nodes, min_walltime_s, max_walltime_s, margin_s, granularity_s
    )
    if request is None or sizing == "provider" or request.nodes == min_nodes:
        return request
    return replace(request, min_nodes=min_nodes)
