"""What a node count is worth to a task: the objectives' formulas, evaluated exactly.

For task *j* with throughput curve P_j (samples/s), objective curve O_j (``value``, defaults to
P_j), current count c_j, horizon T = ``tfwd`` and a choice n in D_j = {0} ∪ [min_j, max_j]:

    g_j(n) = G_j(n) · τ_j(n)  −  [n > c_j] · R_up_j · G_j(c_j)  −  [n < c_j] · R_down_j · G_j(c_j)

where the per-second gain G_j depends on the objective:

==================  ====================================================================
``throughput``      G_j(n) = O_j(n)                       (the paper's objective)
``speedup``         G_j(n) = P_j(n) / P_j(1)              (every task counts as much)
``weighted``        G_j(n) = w_j · O_j(n)                 (priorities)
``fair``            lexicographic: first maximise z = min_j ρ_j(n_j) with
                    ρ_j(n) = P_j(n) / max_{k ≤ max_j} P_j(k), then ``throughput``
                    over the counts with ρ_j(n) ≥ z (z found by :func:`fair_threshold`)
``remaining_work``  ``throughput`` with τ capped as below
``balanced``        G_j(n) = (1 + β · N_j / max_k N_k) · O_j(n), where N_j is the node-time
                    task j still needs at its most efficient count (``need_node_s``) and
                    β = :data:`BALANCE_BONUS`: near-ties go to the task furthest from done
``speedup_balanced`` G_j(n) = (1 + β · N_j / max_k N_k) · P_j(n) / P_j(1) while no task
                    waits for admission (not ``tasks_waiting``), else ``speedup``
==================  ====================================================================

``balanced`` is for a batch of tasks run to completion (a sweep whose user waits for the last
trial). ``throughput`` lets the first-submitted tasks finish first, which leaves a tail of a
few tasks spread over many nodes at their worst efficiency; favouring the tasks with the most
work left makes the batch finish together. The bonus is a tie-breaker, not a priority: a
node goes to a task with more work left only when its gain there is within β of the best.
``speedup_balanced`` (the default) balances only the tail: while tasks wait for an admission
slot, a task that finishes early hands its slot to the next one and leaves no tail, and holding
it back to finish with the others only delays that; once none waits, the batch's end is near.

τ_j(n) = T, or, when gain is capped at the remaining work W_j (objective ``remaining_work`` or
``cap_at_remaining_work``), τ_j(n) = min(T, W_j / P_j(n)): a task that finishes within the
horizon earns nothing for the time after it is done. Curves are linearly interpolated between
breakpoints, so values at integer counts are exact whatever the curve's shape.

Since n is an integer, every solver works from the table of g_j over D_j. :func:`affine_runs`
cuts D_j into maximal runs of consecutive counts on which g_j is affine; the MILP
needs one binary per run, not per count, and stays exact for non-concave curves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .errors import AllocationInputError
from .spec import AllocationProblem, Objective, TaskSpec

__all__ = [
    "GainTable",
    "Run",
    "gain_table",
    "gain_tables",
    "fair_threshold",
    "affine_runs",
    "score",
]

# Relative tolerance for "this sequence is affine" and for fair's threshold.
REL_TOL = 1e-9

# β of the ``balanced`` objective. On the dev week (hps-shufflenet-10J, 64 nodes, to completion)
# any β in [0.05, 0.5] gives E_used and E_avail ≥ 0.92 at T_fwd auto; 0.3 was the best there.
BALANCE_BONUS = 0.3


@dataclass(frozen=True)
class GainTable:
    """g_j and ρ_j at every count in the task's domain (``counts`` ascending, starting at 0)."""

    task_id: str
    counts: np.ndarray
    gain: np.ndarray
    rate: np.ndarray


@dataclass(frozen=True)
class Run:
    """Counts ``lo..hi`` on which gain = gain_lo + gain_slope·(n − lo)."""

    lo: int
    hi: int
    gain_lo: float
    gain_slope: float


def _per_second_gain(task: TaskSpec, objective: Objective, n: np.ndarray) -> np.ndarray:
    value_curve = task.value if task.value is not None else task.throughput
    if objective.per_speedup:
        p1 = float(np.interp(1, task.nodes, task.throughput))
        if p1 <= 0:
            raise AllocationInputError(
                f"tasks[{task.id}].throughput", "speedup needs a positive throughput at 1 node"
            )
        return np.asarray(np.interp(n, task.nodes, task.throughput)) / p1
    gain = np.asarray(np.interp(n, task.nodes, value_curve))
    return gain * task.weight if objective is Objective.WEIGHTED else gain


def _balance_factor(task: TaskSpec, problem: AllocationProblem) -> float:
    """1 + β·N_j/max_k N_k under ``balanced``, and ``speedup_balanced`` while no task waits;
    else 1."""
    balancing = problem.objective is Objective.BALANCED or (
        problem.objective is Objective.SPEEDUP_BALANCED and not problem.tasks_waiting
    )
    if not balancing:
        return 1.0
    need = task.need_node_s or 0.0  # never None: AllocationProblem checks it when balancing
    largest = problem.largest_need_node_s
    if math.isinf(largest):  # a rate so small that the time left overflows
        share = 1.0 if math.isinf(need) else 0.0
    else:
        share = need / largest if largest > 0 else 0.0
    return 1.0 + BALANCE_BONUS * share


def gain_table(task: TaskSpec, problem: AllocationProblem) -> GainTable:
    """The exact gain g_j(n) and normalised rate ρ_j(n) of ``task`` over its domain."""
    hi = min(task.max_nodes, problem.capacity)
    counts = np.concatenate(([0], np.arange(task.min_nodes, hi + 1))).astype(np.int64)
    per_s = _per_second_gain(task, problem.objective, counts) * _balance_factor(task, problem)
    throughput = np.interp(counts, task.nodes, task.throughput)
    horizon = np.full(len(counts), problem.tfwd)
    if problem.caps_remaining_work and task.remaining_work is not None:
        with np.errstate(over="ignore"):  # a tiny rate: finishing takes "forever"
            finish = np.divide(
                task.remaining_work,
                throughput,
                out=np.full(len(counts), np.inf),
                where=throughput > 0,
            )
        horizon = np.minimum(horizon, finish)
    gain = per_s * horizon
    c = task.current_nodes
    if c > 0:
        current = float(_per_second_gain(task, problem.objective, np.array([c]))[0])
        current *= _balance_factor(task, problem)
        gain = gain - np.where(counts > c, task.rescale_up_s * current, 0.0)
        gain = gain - np.where(counts < c, task.rescale_down_s * current, 0.0)
    best = float(np.interp(np.arange(task.max_nodes + 1), task.nodes, task.throughput).max())
    rate = throughput / best if best > 0 else np.zeros(len(counts))
    return GainTable(task.id, counts, gain, rate)


def gain_tables(problem: AllocationProblem) -> list[GainTable]:
    """Every task's table; for ``fair``, only the counts that keep the max-min rate."""
    tables = [gain_table(t, problem) for t in problem.tasks]
    if problem.objective is not Objective.FAIR:
        return tables
    z = fair_threshold(tables, problem.capacity)
    keep = [t.rate >= z - REL_TOL for t in tables]
    return [
        GainTable(t.task_id, t.counts[k], t.gain[k], t.rate[k])
        for t, k in zip(tables, keep, strict=True)
    ]


def fair_threshold(tables: list[GainTable], capacity: int) -> float:
    """Largest z such that every task can have rate ≥ z within ``capacity`` nodes.

    The fewest nodes reaching a rate grows with the rate, so a bisection over the rates that
    occur finds it exactly: fair's first (max-min) stage needs no solver.
    """
    candidates = np.unique(np.concatenate([t.rate for t in tables]))

    def nodes_needed(z: float) -> int:
        # The fewest nodes with rate >= z, per task (capacity + 1 when no count reaches z).
        return sum(
            int(t.counts[np.argmax(ok)]) if (ok := t.rate >= z).any() else capacity + 1
            for t in tables
        )

    lo, hi = 0, len(candidates) - 1  # candidates[0] is feasible: every task may have 0 nodes
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if nodes_needed(float(candidates[mid])) <= capacity:
            lo = mid
        else:
            hi = mid - 1
    return float(candidates[lo])


def affine_runs(table: GainTable) -> list[Run]:
    """Maximal runs of consecutive counts on which the gain is affine."""
    c, g = table.counts.tolist(), table.gain.tolist()
    tol = REL_TOL * max(1.0, max(abs(x) for x in g))
    runs: list[Run] = []
    i, n = 0, len(c)
    while i < n:
        j, slope = i, 0.0
        if i + 1 < n and c[i + 1] == c[i] + 1:
            j, slope = i + 1, g[i + 1] - g[i]
            # Extend while the next count is consecutive and lies on the run's line.
            while (
                j + 1 < n
                and c[j + 1] == c[j] + 1
                and abs(g[j + 1] - g[i] - slope * (j + 1 - i)) <= tol
            ):
                j += 1
        runs.append(Run(c[i], c[j], g[i], slope))
        i = j + 1
    return runs


def score(problem: AllocationProblem, counts: Mapping[str, int]) -> tuple[float, float]:
    """(objective value, min normalised rate) of a count per task; raises if infeasible."""
    total, min_rate = 0.0, float("inf")
    used = 0
    for task in problem.tasks:
        table = gain_table(task, problem)
        n = counts.get(task.id, 0)
        where = np.flatnonzero(table.counts == n)
        if len(where) == 0:
            raise AllocationInputError(f"counts[{task.id}]", f"{n} is not a feasible node count")
        total += float(table.gain[where[0]])
        min_rate = min(min_rate, float(table.rate[where[0]]))
        used += n
    if used > problem.capacity:
        raise AllocationInputError("counts", f"uses {used} nodes, capacity is {problem.capacity}")
    return total, min_rate
