"""The emulated machine behind :class:`LocalBackfillProvider`: which nodes are idle, and for how
long, at any emulated time. Pure: built from an :class:`~parsl_bf.inputs.trace.IdleTrace`.
"""

from __future__ import annotations

import bisect

import numpy as np

from ...inputs.trace import IdleTrace

__all__ = ["NodeStates", "synthetic_trace"]


def synthetic_trace(n_nodes: int, idle_s: float, busy_s: float, horizon_s: float) -> IdleTrace:
    """Node i is idle for ``idle_s`` then busy for ``busy_s``, phase-shifted by i/n of a period."""
    period = idle_s + busy_s
    t, node, idle = [], [], []
    for i in range(n_nodes):
        start = -(i * period / n_nodes)  # this node's cycle began before t = 0
        k = 0
        while start + k * period < horizon_s:
            busy_at = start + k * period + idle_s
            idle_at = start + (k + 1) * period
            for when, is_idle in ((busy_at, False), (idle_at, True)):
                if 0 < when < horizon_s:
                    t.append(int(when))
                    node.append(i)
                    idle.append(is_idle)
            k += 1
    order = np.argsort(np.array(t), kind="stable")
    initial = np.array([((i * period / n_nodes) % period) < idle_s for i in range(n_nodes)])
    return IdleTrace(
        tuple(f"node{i}" for i in range(n_nodes)),
        initial,
        np.array(t, dtype=np.int64)[order],
        np.array(node, dtype=np.int64)[order],
        np.array(idle, dtype=bool)[order],
        int(horizon_s),
    )


class NodeStates:
    """Idle mask and hole ends of a trace, queried at increasing times."""

    def __init__(self, trace: IdleTrace) -> None:
        self.trace = trace
        self.names = list(trace.nodes)
        self.index = {name: i for i, name in enumerate(self.names)}
        self._busy_at: list[list[int]] = [[] for _ in self.names]
        for t, i, idle in zip(
            trace.change_t.tolist(),
            trace.change_node.tolist(),
            trace.change_idle.tolist(),
            strict=True,
        ):
            if not idle:
                self._busy_at[i].append(t)
        self._state = trace.initial.copy()
        self._batches = trace.batches()
        self._next = next(self._batches, None)

    def idle_at(self, t: float) -> np.ndarray:
        """Idle mask at trace time ``t`` (calls must not go back in time)."""
        while self._next is not None and self._next[0] <= t:
            self._state[self._next[1]] = self._next[2]
            self._next = next(self._batches, None)
        return self._state.copy()

    def idle_until(self, node: int, t: float) -> float:
        """When ``node``, idle at ``t``, next becomes busy (the trace's end if never)."""
        times = self._busy_at[node]
        k = bisect.bisect_right(times, t)
        return float(times[k]) if k < len(times) else float(self.trace.end_s)
