"""What the main scheduler says about when an idle node is taken back, modelled for a replay.

A real scheduler tells when a hole ends only through its plan. Slurm's ``squeue --start`` gives
the planned start of each pending job on the nodes reserved for it; the Slurm provider turns
that into each pilot's end (:mod:`parsl_bf.providers.slurm.commands`), and PBS does the same
with its estimated start times. The plan is built from the walltimes users request. Jobs end
before their walltime, so a reserved job starts, and the hole ends, before its planned time.

A recorded idle-node trace holds the true ends but not the plan, so the replay models the plan
(:class:`HoleForecast`). A hole that opens at ``o`` and truly ends at ``e``:

- is announced with probability ``announced``, as ending at ``o + (e - o) / a``. The walltime
  accuracy ``a`` (runtime ÷ requested walltime) is drawn uniformly from ``[low, high]`` for each
  hole; ``a = 1`` is exact walltimes, a small ``a`` is a plan far too late;
- otherwise has no planned end (``inf``): no pending job has reserved the node;
- has no planned end either if it is still open at the trace's end.

The allocator then sees only the planned end, as the executor sees its pilots' ends. It never
sees ``e``. It uses the planned end as the executor does (:mod:`parsl_bf.executor.controller`):
nodes that leave before a rescale pays back are not offered, and a growing task takes the
longest-lived nodes first. Draws are seeded, so a replay is reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..inputs.trace import IdleTrace

__all__ = ["HoleForecast", "planned_ends"]


@dataclass(frozen=True)
class HoleForecast:
    """The model of the scheduler's planned hole ends; see the module docstring."""

    accuracy_low: float = 1.0
    accuracy_high: float = 1.0
    announced: float = 1.0  # the fraction of holes that a pending job has reserved
    seed: int = 0

    def __post_init__(self) -> None:
        lo, hi = self.accuracy_low, self.accuracy_high
        if not (0 < lo <= hi <= 1 and math.isfinite(lo)):
            raise ValueError(f"walltime accuracy [{lo}, {hi}]: need 0 < low <= high <= 1")
        if not 0 <= self.announced <= 1:
            raise ValueError(f"announced fraction {self.announced}: need 0 to 1")

    def describe(self) -> str:
        """E.g. ``a ~ U(0.5, 1), 80% announced``: the walltime accuracy and what is announced."""
        lo, hi = self.accuracy_low, self.accuracy_high
        text = f"a = {lo:g}" if lo == hi else f"a ~ U({lo:g}, {hi:g})"
        return text + ("" if self.announced == 1 else f", {self.announced:.0%} announced")


def planned_ends(trace: IdleTrace, forecast: HoleForecast) -> dict[tuple[int, int], float]:
    """(node, time it became idle) → the planned end of that hole, for every hole of ``trace``
    (the holes open at t = 0 included)."""
    # Every time a node becomes idle, and the node's next change (when it becomes busy again).
    node = np.concatenate((np.flatnonzero(trace.initial), trace.change_node)).astype(np.int64)
    t = np.concatenate((np.zeros(int(trace.initial.sum())), trace.change_t)).astype(np.int64)
    idle = np.concatenate((np.ones(int(trace.initial.sum()), bool), trace.change_idle))
    order = np.lexsort((t, node))  # by node, then time
    node, t, idle = node[order], t[order], idle[order]
    same_next = np.zeros(len(node), bool)
    same_next[:-1] = node[1:] == node[:-1]
    end = np.full(len(node), np.inf)
    end[:-1] = np.where(same_next[:-1], t[1:], np.inf)
    opens = np.flatnonzero(idle)
    rng = np.random.default_rng(forecast.seed)
    accuracy = rng.uniform(forecast.accuracy_low, forecast.accuracy_high, len(opens))
    announced = rng.random(len(opens)) < forecast.announced
    out: dict[tuple[int, int], float] = {}
    for i, a, said in zip(opens.tolist(), accuracy.tolist(), announced.tolist(), strict=True):
        e = float(end[i])
        o = int(t[i])
        out[(int(node[i]), o)] = o + (e - o) / a if said and math.isfinite(e) else math.inf
    return out
