"""Idle-node traces from the Standard Workload Format (Parallel Workloads Archive).

Assumptions, since SWF records jobs, not nodes:
- a job holds ``ceil(allocated processors / procs_per_node)`` nodes (requested processors when
  the allocated field is -1) from ``submit + wait`` to ``submit + wait + run time``;
- nodes are given to starting jobs lowest index first and returned at the job's end, so each
  node has well-defined idle intervals; the machine size is the header's ``MaxNodes`` (or
  ``MaxProcs / procs_per_node``) unless given;
- jobs with an unknown start or run time (-1) or no processors are skipped and counted; a job
  that does not fit (the log over-commits the machine) gets the nodes that are free, counted too.
Times are seconds from the log's first submission.
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ReplayInputError
from .trace import IdleTrace

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
    header: dict[str, str] = {}
    spans: list[tuple[int, int, int]] = []  # start, end, nodes
    skipped = 0
    with path.open() as f:
        for line_no, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if line.startswith(";"):
                if m := _HEADER.match(line):
                    header[m.group(1)] = m.group(2)
                continue
            fields = line.split()
            if len(fields) < 8:
                raise ReplayInputError(path, f"{len(fields)} fields, SWF has 18", line_no)
            try:
                submit, wait, run, alloc = (float(x) for x in fields[1:5])
                requested = float(fields[7])
            except ValueError:
                raise ReplayInputError(path, "not a number", line_no, "fields 2-5") from None
            procs = alloc if alloc > 0 else requested
            if wait < 0 or run < 0 or procs <= 0 or submit < 0:
                skipped += 1
                continue
            start = int(submit + wait)
            spans.append((start, start + int(run), math.ceil(procs / procs_per_node)))
    if n_nodes is None:
        if "MaxNodes" in header:
            n_nodes = int(header["MaxNodes"])
        elif "MaxProcs" in header:
            n_nodes = int(header["MaxProcs"]) // procs_per_node
        else:
            raise ReplayInputError(path, "no MaxNodes/MaxProcs header: give the node count")
    if not spans:
        raise ReplayInputError(path, "no usable jobs")
    origin = min(s for s, _, _ in spans)
    free = list(range(n_nodes))  # a heap: lowest index first
    running: list[tuple[int, int, list[int]]] = []  # (end, seq, nodes)
    t_list: list[int] = []
    node_list: list[int] = []
    idle_list: list[bool] = []

    def emit(t: int, nodes: list[int], idle: bool) -> None:
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
