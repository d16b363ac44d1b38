"""Idle-node traces: which nodes the main scheduler leaves idle, and when.

Reads the bftrainer-dev format (``trace/events.csv.gz`` + ``trace/nodes.csv`` + ``meta.json``,
documented in the data's README): the state of every node at t = 0, then state changes. A node
subset is taken by column order (``col_index``), as the original replayer's ``-nN``/``-nis``
options do. The files are checked as untrusted input (see :mod:`parsl_bf.inputs.errors`): node
names and column indices unique, times whole seconds within bounds, ``meta.json``'s ``end_s``
not before the last event.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..decisions import resolve_tfwd
from .errors import (
    MAX_EVENTS,
    MAX_NODES,
    MAX_SECONDS,
    ReplayInputError,
    csv_errors,
    integer,
    json_error,
    read_json,
    text_lines,
)

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

    def batches(self) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(t, node indices, new idle states) for every time at which some node changes."""
        bounds = np.flatnonzero(np.diff(self.change_t)) + 1
        starts = np.concatenate(([0], bounds))
        ends = np.concatenate((bounds, [len(self.change_t)]))
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            if b > a:
                yield int(self.change_t[a]), self.change_node[a:b], self.change_idle[a:b]

    def steps(self) -> Iterator[tuple[int, np.ndarray]]:
        """(t, idle mask) at t = 0 and at every time some node changes state."""
        state = self.initial.copy()
        yield 0, state.copy()
        for t, nodes, idle in self.batches():
            state[nodes] = idle
            yield t, state.copy()

    def hole_lengths(self, start_s: int = 0, end_s: int | None = None) -> np.ndarray:
        """Durations of the idle intervals that open and close within [start_s, end_s]."""
        end_s = self.end_s if end_s is None else end_s
        opened = np.full(len(self.nodes), -1, dtype=np.int64)
        lengths: list[int] = []
        for t, nodes, idle in self.batches():
            if t > end_s:
                break
            if t <= start_s:
                continue
            for x, now_idle in zip(nodes.tolist(), idle.tolist(), strict=True):
                if now_idle:
                    opened[x] = t
                elif opened[x] >= 0:
                    lengths.append(t - int(opened[x]))
                    opened[x] = -1
        return np.array(lengths, dtype=np.int64)

    def suggest_tfwd(self, start_s: int = 0, end_s: int | None = None) -> float:
        """T_fwd from the holes: the median time a node stays idle once it becomes idle.

        A rescale pays off when its gain over T_fwd beats its cost; the typical hole length
        is how long a grown task can expect to keep a node it just got.
        """
        lengths = self.hole_lengths(start_s, end_s)
        if len(lengths) == 0:
            raise ValueError("no complete hole in the window: give T_fwd explicitly")
        return resolve_tfwd("auto", lengths)

    def idle_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Times and the number of idle nodes from each time on."""
        pairs = [(t, int(mask.sum())) for t, mask in self.steps()]
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def _columns(path: Path, reader: csv.DictReader, needed: tuple[str, ...]) -> None:
    missing = [c for c in needed if c not in (reader.fieldnames or [])]
    if missing:
        raise ReplayInputError(path, f"missing column(s) {', '.join(missing)}", line=1)


def _node_order(nodes_csv: Path) -> list[str]:
    """The node names of ``nodes.csv`` by ``col_index``: unique names, unique indices."""
    reader = csv.DictReader(text_lines(nodes_csv))
    names: dict[str, int] = {}  # name: line
    columns: dict[int, int] = {}  # col_index: line
    order: list[tuple[int, str]] = []
    with csv_errors(nodes_csv, reader):
        _columns(nodes_csv, reader, ("node", "col_index"))
        for row in reader:
            line = reader.line_num
            name, col = row["node"], row["col_index"]
            if not name:
                raise ReplayInputError(nodes_csv, "missing", line, "node")
            if name in names:
                raise ReplayInputError(
                    nodes_csv, f"duplicate node {name!r} (also line {names[name]})", line, "node"
                )
            try:
                index = integer(col, 0, 10**9)
            except ValueError as exc:
                raise ReplayInputError(nodes_csv, str(exc), line, "col_index") from None
            if index in columns:
                raise ReplayInputError(
                    nodes_csv,
                    f"duplicate col_index {index} (also line {columns[index]})",
                    line,
                    "col_index",
                )
            if len(order) >= MAX_NODES:
                raise ReplayInputError(nodes_csv, f"more than {MAX_NODES} nodes", line)
            names[name], columns[index] = line, line
            order.append((index, name))
    return [name for _, name in sorted(order)]


def _end_s(meta: Path, last_t: int) -> int:
    """``end_s`` of ``meta.json``: whole seconds, not before the last event."""
    data, text = read_json(meta, 1 << 20)
    if not isinstance(data, dict):
        raise ReplayInputError(meta, f"expected a JSON object, got {type(data).__name__}", 1)
    if "end_s" not in data:
        raise ReplayInputError(meta, "missing", 1, "end_s")
    try:
        end_s = integer(data["end_s"], 1, MAX_SECONDS)
    except ValueError as exc:
        raise json_error(meta, text, "end_s", str(exc)) from None
    if end_s < last_t:
        raise json_error(meta, text, "end_s", f"{end_s} is before the last event ({last_t} s)")
    return end_s


def load_trace(
    trace_dir: str | Path, n_nodes: int | None = None, node_offset: int = 0
) -> IdleTrace:
    """The trace of ``n_nodes`` nodes from column ``node_offset`` on (all nodes by default).

    Bounded: at most :data:`~parsl_bf.inputs.errors.MAX_NODES` nodes and
    :data:`~parsl_bf.inputs.errors.MAX_EVENTS` events, times in whole seconds up to
    :data:`~parsl_bf.inputs.errors.MAX_SECONDS`; any other content is a ReplayInputError.
    """
    trace_dir = Path(trace_dir)
    nodes_csv = trace_dir / "nodes.csv"
    if n_nodes is not None and n_nodes < 1:
        raise ReplayInputError(nodes_csv, f"{n_nodes} nodes asked for: at least 1 is needed")
    if node_offset < 0:
        raise ReplayInputError(nodes_csv, f"node offset {node_offset}: must be at least 0")
    order = _node_order(nodes_csv)
    names = order[node_offset:]
    if n_nodes is not None:
        names = names[:n_nodes]
    if not names:
        raise ReplayInputError(nodes_csv, f"no nodes from offset {node_offset}")
    known = set(order)
    index = {name: i for i, name in enumerate(names)}
    initial = np.zeros(len(names), dtype=bool)
    t, node, idle = [], [], []
    events = trace_dir / "events.csv.gz"
    last_t = 0
    reader = csv.DictReader(text_lines(events, compressed=True))
    with csv_errors(events, reader):
        _columns(events, reader, ("t_s", "node", "state"))
        for rows, row in enumerate(reader):
            line = reader.line_num
            if rows >= MAX_EVENTS:
                raise ReplayInputError(events, f"more than {MAX_EVENTS} events", line)
            try:
                t_s = integer(row["t_s"], 0, MAX_SECONDS)
            except ValueError as exc:
                raise ReplayInputError(events, str(exc), line, "t_s") from None
            if t_s < last_t:
                raise ReplayInputError(
                    events, f"time goes backwards ({t_s} < {last_t})", line, "t_s"
                )
            last_t = t_s
            if row["state"] not in ("idle", "busy"):
                raise ReplayInputError(events, f"{row['state']!r} is not idle/busy", line, "state")
            i = index.get(row["node"])
            if i is None:
                if row["node"] not in known:
                    raise ReplayInputError(events, f"unknown node {row['node']!r}", line, "node")
                continue
            if t_s == 0:
                initial[i] = row["state"] == "idle"
            else:
                t.append(t_s)
                node.append(i)
                idle.append(row["state"] == "idle")
    meta = trace_dir / "meta.json"
    end_s = _end_s(meta, last_t) if meta.exists() else last_t
    return IdleTrace(
        tuple(names),
        initial,
        np.array(t, dtype=np.int64),
        np.array(node, dtype=np.int64),
        np.array(idle, dtype=bool),
        end_s,
    )
