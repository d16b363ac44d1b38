"""Idle-node traces: which nodes the main scheduler leaves idle, and when.

Reads the bftrainer-dev format (``trace/events.csv.gz`` + ``trace/nodes.csv``, documented in the
data's README): an initial state of every node at t = 0, then state changes. A node subset is
taken by column order (``col_index``), as the original replayer's ``-nN``/``-nis`` options do.
"""

from __future__ import annotations

import csv
import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["IdleTrace", "load_trace"]


@dataclass(frozen=True)
class IdleTrace:
    """Node states over time: ``initial[i]`` is node i idle at t = 0; changes sorted by time."""

    nodes: tuple[str, ...]
    initial: np.ndarray  # bool, per node
    change_t: np.ndarray  # int seconds, sorted
    change_node: np.ndarray  # int node index
    change_idle: np.ndarray  # bool: becomes idle (True) or busy (False)
    end_s: int

    def steps(self) -> Iterator[tuple[int, np.ndarray]]:
        """(t, idle mask) at t = 0 and at every time some node changes state."""
        state = self.initial.copy()
        yield 0, state.copy()
        bounds = np.flatnonzero(np.diff(self.change_t)) + 1
        for chunk in np.split(np.arange(len(self.change_t)), bounds):
            if len(chunk) == 0:
                continue
            state[self.change_node[chunk]] = self.change_idle[chunk]
            yield int(self.change_t[chunk[0]]), state.copy()

    def idle_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Times and the number of idle nodes from each time on."""
        pairs = [(t, int(mask.sum())) for t, mask in self.steps()]
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def load_trace(
    trace_dir: str | Path, n_nodes: int | None = None, node_offset: int = 0
) -> IdleTrace:
    """The trace of ``n_nodes`` nodes from column ``node_offset`` on (all nodes by default)."""
    trace_dir = Path(trace_dir)
    with (trace_dir / "nodes.csv").open(newline="") as f:
        order = sorted(csv.DictReader(f), key=lambda r: int(r["col_index"]))
    names = [r["node"] for r in order][node_offset:]
    if n_nodes is not None:
        names = names[:n_nodes]
    index = {name: i for i, name in enumerate(names)}
    initial = np.zeros(len(names), dtype=bool)
    t, node, idle = [], [], []
    with gzip.open(trace_dir / "events.csv.gz", "rt", newline="") as f:
        rows = csv.reader(f)
        next(rows)
        for t_s, name, state in rows:
            i = index.get(name)
            if i is None:
                continue
            if t_s == "0":
                initial[i] = state == "idle"
            else:
                t.append(int(t_s))
                node.append(i)
                idle.append(state == "idle")
    end_s = int(json.loads((trace_dir / "meta.json").read_text())["end_s"])
    return IdleTrace(
        tuple(names),
        initial,
        np.array(t, dtype=np.int64),
        np.array(node, dtype=np.int64),
        np.array(idle, dtype=bool),
        end_s,
    )
