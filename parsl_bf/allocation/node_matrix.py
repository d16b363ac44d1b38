"""The original system's formulation, kept as a baseline for benchmarks and cross-checks.

As in BFTrainer's MILP: binary x[j, v] = task j runs on node v, for every task and every
available node; big-M rows for n_j ∈ {0} ∪ [min_j, max_j]; a binary x XOR c per (task, node)
with four rows each, and a "no migration" rule that the count changes by exactly the number of
changed entries; a λ (convex-combination) scaling curve whose SOS2 condition is emulated with
one binary per segment (GLPK has no SOS constraints); big-M up/down indicators for the rescale
charge. Same objective as :mod:`.milp`, so both optima are equal; this model grows with the node
count N. Only the per-second-gain objectives (``throughput``, ``speedup``, ``weighted``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyomo.environ as pyo

from .errors import AllocationInputError
from .gains import _per_second_gain
from .milp import _glpk
from .spec import Allocation, AllocationProblem, Objective, SolveStatus, TaskSpec

__all__ = ["solve_node_matrix"]


def _breakpoints(task: TaskSpec, cap: int) -> np.ndarray:
    hi = min(task.max_nodes, cap)
    if hi < task.min_nodes:  # the task cannot run at all
        return np.array([0], dtype=np.int64)
    inner = [b for b in task.nodes if task.min_nodes < b < hi]
    return np.array(sorted({0, task.min_nodes, hi, *inner}), dtype=np.int64)


def solve_node_matrix(problem: AllocationProblem, time_limit: float | None = 60.0) -> Allocation:
    """Solve ``problem`` with the task × node model; status ``fallback`` means no answer in time."""
    if problem.objective not in (Objective.THROUGHPUT, Objective.SPEEDUP, Objective.WEIGHTED):
        raise AllocationInputError("objective", f"node-matrix baseline lacks {problem.objective}")
    start = time.perf_counter()
    tasks = problem.tasks
    held: dict[int, set[int]] = {}
    v = 0
    for j, t in enumerate(tasks):  # nodes 0..N-1: each task's held nodes, then the free ones
        held[j] = set(range(v, v + t.current_nodes))
        v += t.current_nodes
    nodes = range(problem.capacity)
    jobs = range(len(tasks))
    bps = [_breakpoints(t, problem.capacity) for t in tasks]
    gains = [
        problem.tfwd * _per_second_gain(t, problem.objective, b)
        for t, b in zip(tasks, bps, strict=True)
    ]
    rate = [
        float(_per_second_gain(t, problem.objective, np.array([t.current_nodes]))[0]) for t in tasks
    ]

    big_m = problem.capacity + 1
    m = pyo.ConcreteModel()
    m.x = pyo.Var(jobs, nodes, domain=pyo.Binary)
    m.xor = pyo.Var(jobs, nodes, domain=pyo.Binary)  # x[j,v] XOR held[j,v]
    m.at_least_min = pyo.Var(jobs, domain=pyo.Binary)
    m.at_most_max = pyo.Var(jobs, domain=pyo.Binary)
    m.migrate = pyo.Var(jobs, domain=pyo.Binary)
    m.up = pyo.Var(jobs, domain=pyo.Binary)
    m.down = pyo.Var(jobs, domain=pyo.Binary)
    lam_idx = [(j, k) for j in jobs for k in range(len(bps[j]))]
    seg_idx = [(j, k) for j in jobs for k in range(len(bps[j]) - 1)]
    m.lam = pyo.Var(lam_idx, bounds=(0, 1))
    m.seg = pyo.Var(seg_idx, domain=pyo.Binary)  # SOS2 emulation: GLPK has no SOS constraints
    m.rows = pyo.ConstraintList()
    add = m.rows.add

    def n(j: int) -> Any:  # a Pyomo expression
        return sum(m.x[j, v] for v in nodes)

    def c(j: int, v: int) -> int:
        return int(v in held[j])

    for j in jobs:
        t = tasks[j]
        # n_j = 0 or min_j <= n_j <= max_j, with big-M rows as in the original.
        add(n(j) >= t.min_nodes - big_m * m.at_least_min[j])
        add(n(j) <= big_m * (1 - m.at_least_min[j]))
        add(t.max_nodes >= n(j) - big_m * m.at_most_max[j])
        add(n(j) <= big_m * (1 - m.at_most_max[j]))
    for v in nodes:
        add(sum(m.x[j, v] for j in jobs) <= 1)
    for j in jobs:
        for v in nodes:  # xor = x XOR c, linearised
            add(m.xor[j, v] <= m.x[j, v] + c(j, v))
            add(m.xor[j, v] >= m.x[j, v] - c(j, v))
            add(m.xor[j, v] >= c(j, v) - m.x[j, v])
            add(m.xor[j, v] <= 2 - m.x[j, v] - c(j, v))
        # No migration: the count changes by exactly the number of changed entries.
        changed = sum(m.xor[j, v] for v in nodes)
        delta = n(j) - tasks[j].current_nodes
        add(delta >= changed - big_m * m.migrate[j])
        add(delta <= -changed + big_m * (1 - m.migrate[j]))
        k_all = range(len(bps[j]))
        add(sum(m.lam[j, k] for k in k_all) == 1)
        add(n(j) == sum(int(bps[j][k]) * m.lam[j, k] for k in k_all))
        add(sum(m.seg[j, s] for s in range(len(bps[j]) - 1)) == 1)
        for k in k_all:  # λ_k > 0 only next to the chosen segment
            add(m.lam[j, k] <= sum(m.seg[j, s] for s in (k - 1, k) if 0 <= s < len(bps[j]) - 1))
        cj = tasks[j].current_nodes
        add(n(j) <= cj + (big_m - cj) * m.up[j])
        add(n(j) >= (cj + 1) * m.up[j])
        add(n(j) <= (cj - 1) + (big_m - (cj - 1)) * (1 - m.down[j]))
        add(n(j) >= cj * (1 - m.down[j]))
    m.gain = pyo.Objective(
        expr=sum(
            sum(float(gains[j][k]) * m.lam[j, k] for k in range(len(bps[j])))
            - tasks[j].rescale_up_s * rate[j] * m.up[j]
            - tasks[j].rescale_down_s * rate[j] * m.down[j]
            for j in jobs
        ),
        sense=pyo.maximize,
    )
    results = _glpk(time_limit).solve(m, load_solutions=False)
    cond = results.solver.termination_condition
    if cond.name not in ("optimal", "feasible") or len(results.solution) == 0:
        return Allocation(
            status=SolveStatus.FALLBACK,
            objective=float("nan"),
            counts={},
            solve_s=time.perf_counter() - start,
        )
    m.solutions.load_from(results)
    counts = {tasks[j].id: int(round(pyo.value(n(j)))) for j in jobs}
    return Allocation(
        status=SolveStatus.OPTIMAL if cond.name == "optimal" else SolveStatus.FEASIBLE,
        objective=float(pyo.value(m.gain)),
        counts=counts,
        solve_s=time.perf_counter() - start,
    )
