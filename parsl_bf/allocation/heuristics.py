"""The original BFTrainer's two allocation heuristics, beside the MILP: equal share and greedy.

Each maps an :class:`~parsl_bf.allocation.AllocationProblem` to an
:class:`~parsl_bf.allocation.Allocation`, like the MILP, so a policy calls them alike.
"""

from __future__ import annotations

import time

from .gains import gain_table, score
from .spec import Allocation, AllocationProblem, SolveStatus

__all__ = ["equal_share", "greedy"]


def _answer(problem: AllocationProblem, counts: dict[str, int], start: float) -> Allocation:
    return Allocation(
        status=SolveStatus.FEASIBLE,
        objective=score(problem, counts)[0],
        counts=counts,
        solve_s=time.perf_counter() - start,
    )


def equal_share(problem: AllocationProblem) -> Allocation:
    """The original's heuristic, as its code does it: a share of ⌊N/J⌋ each, clipped to
    ``max_nodes``, where it exceeds ``min_nodes`` (a share of exactly ``min_nodes`` gives 0:
    ``frule`` in the original's ``progGRB.py``, line 121 at BFTrainer/Replayer 515f0e5); then
    the leftovers, first come first served, each task up to its ``max_nodes`` (one at 0 only if
    that reaches ``min_nodes``)."""
    start = time.perf_counter()
    tasks = problem.tasks
    share = problem.capacity // len(tasks)
    counts = {t.id: min(share, t.max_nodes) if share > t.min_nodes else 0 for t in tasks}
    left = problem.capacity - sum(counts.values())
    for t in tasks:  # tasks arrive in admission order
        extra = t.max_nodes - counts[t.id] if counts[t.id] else t.max_nodes
        extra = min(extra, left)
        if counts[t.id] == 0 and extra < t.min_nodes:
            continue
        counts[t.id] += extra
        left -= extra
    return _answer(problem, counts, start)


def greedy(problem: AllocationProblem) -> Allocation:
    """Repeatedly give the next feasible count to the task with the best gain per added node."""
    start = time.perf_counter()
    tables = [gain_table(t, problem) for t in problem.tasks]
    pos = [0] * len(tables)  # index into each table's counts; 0 is "0 nodes"
    left = problem.capacity
    while True:
        best, best_j = 0.0, -1
        for j, t in enumerate(tables):
            k = pos[j]
            if k + 1 >= len(t.counts):
                continue
            step = int(t.counts[k + 1] - t.counts[k])
            if step > left:
                continue
            per_node = float(t.gain[k + 1] - t.gain[k]) / step
            if per_node > best:
                best, best_j = per_node, j
        if best_j < 0:
            break
        left -= int(tables[best_j].counts[pos[best_j] + 1] - tables[best_j].counts[pos[best_j]])
        pos[best_j] += 1
    counts = {t.task_id: int(t.counts[k]) for t, k in zip(tables, pos, strict=True)}
    return _answer(problem, counts, start)
