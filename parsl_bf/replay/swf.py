"""Idle-node traces from the Standard Workload Format (Parallel Workloads Archive).

Assumptions, since SWF records jobs, not nodes:
- a job holds ``ceil(allocated processors / procs_per_node)`` nodes (requested processors when
  the allocated field is -1) from ``submit + wait`` to ``submit + wait + run time``;
- nodes are given to starting jobs lowest index first and returned at the job's end, so each
  node has well-defined idle intervals; the machine size is the header's ``MaxNodes`` (or
  ``MaxProcs / procs_per_node``) unless given;
- jobs with an unknown start or run time (-1) or no processors are skipped and counted; a job
  that does not fit (the log over-commits the machine) gets the nodes that are free, counted too.
Times are seconds from the log's first submission. The log is untrusted input: times must be
finite and within :data:`~parsl_bf.inputs.errors.MAX_SECONDS`, the machine at most
:data:`~parsl_bf.inputs.errors.MAX_NODES` nodes, the jobs and the node state changes they
imply at most :data:`~parsl_bf.inputs.errors.MAX_JOBS` and
:data:`~parsl_bf.inputs.errors.MAX_EVENTS`.
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..inputs.errors import (
    MAX_EVENTS,
    MAX_JOBS,
    MAX_NODES,
    MAX_SECONDS,
    ReplayInputError,
    integer,
    number,
    text_lines,
)
from ..inputs.trace import IdleTrace

__all__ = ["SwfStats", "load_swf"]

_HEADER = re.compile(r"^;\s*(\w+):\s*(\S+)")


@dataclass(frozen=True)
class SwfStats:
    jobs: int
    skipped: int
    squeezed: int  # jobs that got fewer nodes than they asked for


def load_swf(
    path: str | Path, n_nodes: int | None = None, procs_per_node: int = 1
) -> tuple[IdleTrace, SwfStats]:
    """The idle-node trace implied by an SWF log; see the module docstring."""
    path = Path(path)
    if procs_per_node < 1:
        raise ReplayInputError(path, f"{procs_per_node} processors per node: at least 1")
    header: dict[str, tuple[str, int]] = {}  # key: (value, line)
    spans: list[tuple[int, int, int]] = []  # start, end, nodes
    skipped = 0
    for line_no, line in enumerate(text_lines(path), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith(";"):
            if m := _HEADER.match(line):
                header[m.group(1)] = (m.group(2), line_no)
            continue
        fields = line.split()
        if len(fields) < 8:
            raise ReplayInputError(path, f"{len(fields)} fields, SWF has 18", line_no)
        if len(spans) + skipped >= MAX_JOBS:
            raise ReplayInputError(path, f"more than {MAX_JOBS} jobs", line_no)
        try:
            # -1 is SWF's "unknown"; anything else must be a time within bounds.
            submit, wait, run = (number(x, -1, MAX_SECONDS) for x in fields[1:4])
            alloc, requested = (number(x, -1, 1e12) for x in (fields[4], fields[7]))
        except ValueError as exc:
            raise ReplayInputError(path, str(exc), line_no, "fields 2-5, 8") from None
        procs = alloc if alloc > 0 else requested
        if wait < 0 or run < 0 or procs <= 0 or submit < 0:
            skipped += 1
            continue
        start = int(submit + wait)
        spans.append((start, start + int(run), math.ceil(procs / procs_per_node)))
    if n_nodes is None:
        for key, per in (("MaxNodes", 1), ("MaxProcs", procs_per_node)):
            if key in header:
                value, line_no = header[key]
                try:
                    n_nodes = integer(value, 1, MAX_NODES * per) // per
                except ValueError as exc:
                    raise ReplayInputError(path, str(exc), line_no, key) from None
                break
        else:
            raise ReplayInputError(path, "no MaxNodes/MaxProcs header: give the node count")
    if not 1 <= n_nodes <= MAX_NODES:
        raise ReplayInputError(path, f"{n_nodes} nodes: must be 1 to {MAX_NODES}")
    if not spans:
        raise ReplayInputError(path, "no usable jobs")
    origin = min(s for s, _, _ in spans)
    free = list(range(n_nodes))  # a heap: lowest index first
    running: list[tuple[int, int, list[int]]] = []  # (end, seq, nodes)
    t_list: list[int] = []
    node_list: list[int] = []
    idle_list: list[bool] = []

    def emit(t: int, nodes: list[int], idle: bool) -> None:
        if len(t_list) + len(nodes) > MAX_EVENTS:
            raise ReplayInputError(path, f"implies more than {MAX_EVENTS} node state changes")
        t_list.extend([t - origin] * len(nodes))
        node_list.extend(nodes)
        idle_list.extend([idle] * len(nodes))

    squeezed = 0
    for seq, (start, end, want) in enumerate(sorted(spans)):
        while running and running[0][0] <= start:
            t_end, _, nodes = heapq.heappop(running)
            for x in nodes:
                heapq.heappush(free, x)
            emit(t_end, nodes, True)
        take = min(want, len(free))
        squeezed += take < want
        nodes = [heapq.heappop(free) for _ in range(take)]
        emit(start, nodes, False)
        heapq.heappush(running, (end, seq, nodes))
    end_s = max(e for _, e, _ in spans) - origin
    while running:
        t_end, _, nodes = heapq.heappop(running)
        emit(t_end, nodes, True)
    order = np.argsort(np.array(t_list, dtype=np.int64), kind="stable")
    t_arr = np.array(t_list, dtype=np.int64)[order]
    # At t = 0 every node is idle; changes at t = 0 become the initial state.
    initial = np.ones(n_nodes, dtype=bool)
    nodes_arr = np.array(node_list, dtype=np.int64)[order]
    idle_arr = np.array(idle_list, dtype=bool)[order]
    at_zero = t_arr == 0
    initial[nodes_arr[at_zero]] = idle_arr[at_zero]
    trace = IdleTrace(
        tuple(f"n{i}" for i in range(n_nodes)),
        initial,
        t_arr[~at_zero],
        nodes_arr[~at_zero],
        idle_arr[~at_zero],
        int(end_s),
    )
    return trace, SwfStats(len(spans), skipped, squeezed)
