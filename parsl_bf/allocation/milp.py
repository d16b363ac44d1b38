"""The allocation MILP on node counts, built with Pyomo and solved by GLPK.

Formulation ("affine runs", a multiple-choice model; chosen by measurement, see
``docs/allocator.md``). For every task j, :func:`~parsl_bf.allocation.gains.affine_runs` cuts its
domain into runs r = [lo_r, hi_r] on which the gain is affine, g(lo_r + d) = g_r + s_r·d.
Variables: y_r ∈ {0,1} picks a run, d_r ∈ ℤ≥0 is the offset in it (only for runs longer than
one count):

    max  Σ_r g_r·y_r + s_r·d_r
    s.t. Σ_{r ∈ j} y_r = 1                   (one run per task; the run {0} means "stopped")
         d_r ≤ (hi_r − lo_r)·y_r
         Σ_r lo_r·y_r + d_r ≤ N               (free nodes + nodes held now)

The model is exact for any curve shape, and its size grows with the number of breakpoints, not
with the node count (the paper's task × node matrix grows with N). For ``fair``, the max-min
stage is exact and solver-free (the tables keep only counts with ρ_j(n) ≥ z*), and the MILP
solves the throughput stage.

On a time limit the exact dynamic program (:mod:`~parsl_bf.allocation.exact`, a fraction of a
second at the executor's sizes) answers if GLPK has no incumbent or a worse one (status
``fallback``); else GLPK's incumbent is used (status ``feasible``). With many near-identical tasks
(a sweep of 100 trials of one model on thousands of nodes) GLPK can find the optimum at once and
still spend its whole limit proving it: docs/allocator.md, "Time limit". The old allocation is
never kept by default.
"""

from __future__ import annotations

import itertools
import logging
import math
import shutil
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyomo.common.tee as pyomo_tee
import pyomo.environ as pyo
from pyomo.common.errors import ApplicationError
from pyomo.opt import SolverFactory, TerminationCondition

from .errors import SolverUnavailableError
from .exact import solve_exact
from .gains import REL_TOL, GainTable, Run, affine_runs, gain_tables
from .spec import MAX_EXACT_WORK, Allocation, AllocationProblem, SolveStatus

__all__ = ["solve_milp", "build_model", "at_time_limit"]

GLPSOL = "glpsol"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Built:
    model: pyo.ConcreteModel
    tables: list[GainTable]
    runs: list[tuple[int, Run]]  # (task index, run), in variable order


def _width(r: Run) -> int:
    return r.hi - r.lo


def _clean(x: float, scale: float) -> float:
    """x / scale, with round-off-sized values set to 0: GLPK's scaling fails on tiny entries."""
    y = x / scale
    return 0.0 if abs(y) < _NEGLIGIBLE else y


_NEGLIGIBLE = 1e-12


def _interchangeable(tables: list[GainTable]) -> list[list[int]]:
    """Groups (of two or more) of task indices whose gain tables are identical."""
    groups: dict[bytes, list[int]] = {}
    for j, t in enumerate(tables):
        groups.setdefault(t.counts.tobytes() + t.gain.tobytes(), []).append(j)
    return [g for g in groups.values() if len(g) > 1]


def build_model(problem: AllocationProblem) -> _Built:
    """The Pyomo model of ``problem``.

    Gains are divided by their largest magnitude so that GLPK sees coefficients of order 1.
    """
    tables = gain_tables(problem)
    scale = max(1e-300, max(float(abs(t.gain).max()) for t in tables))
    runs = [
        (j, Run(r.lo, r.hi, _clean(r.gain_lo, scale), _clean(r.gain_slope, scale)))
        for j, table in enumerate(tables)
        for r in affine_runs(table)
    ]
    idx = range(len(runs))
    wide = [i for i in idx if runs[i][1].hi > runs[i][1].lo]
    m = pyo.ConcreteModel()
    m.y = pyo.Var(idx, domain=pyo.Binary)
    # d_r: how far above lo_r the count lies, within a chosen run only.
    m.d = pyo.Var(wide, domain=pyo.NonNegativeIntegers, bounds=lambda _, i: (0, _width(runs[i][1])))
    m.in_run = pyo.Constraint(wide, rule=lambda m, i: m.d[i] <= _width(runs[i][1]) * m.y[i])
    by_task: list[list[int]] = [[] for _ in problem.tasks]
    for i, (j, _) in enumerate(runs):
        by_task[j].append(i)
    m.one = pyo.Constraint(
        range(len(by_task)), rule=lambda m, j: sum(m.y[i] for i in by_task[j]) == 1
    )
    used = [runs[i][1].lo * m.y[i] for i in idx if runs[i][1].lo] + [m.d[i] for i in wide]
    if used:  # no term: every task is held at 0 nodes, nothing to constrain
        m.capacity = pyo.Constraint(expr=sum(used) <= problem.capacity)
    # Tasks with the same gain table (a sweep's trials, a family sharing measured rates) are
    # interchangeable: any optimum permuted among them is one too. Ordering their counts keeps
    # only one of those permutations, without which GLPK may spend its whole time limit
    # proving optimality among them.
    widths = set(wide)
    count = [
        sum(runs[i][1].lo * m.y[i] + (m.d[i] if i in widths else 0) for i in by_task[j])
        for j in range(len(by_task))
    ]
    m.symmetry = pyo.ConstraintList()
    for group in _interchangeable(tables):
        for a, b in itertools.pairwise(group):
            m.symmetry.add(count[a] >= count[b])
    m.gain = pyo.Objective(
        expr=sum(runs[i][1].gain_lo * m.y[i] for i in idx)
        + sum(runs[i][1].gain_slope * m.d[i] for i in wide),
        sense=pyo.maximize,
    )
    return _Built(m, tables, runs)


def _glpk(time_limit: float | None) -> Any:  # a Pyomo solver (Pyomo has no types)
    if shutil.which(GLPSOL) is None:
        raise SolverUnavailableError(
            "GLPK's glpsol is not on PATH: install it (Debian: apt-get install glpk-utils)"
        )
    # Pyomo reads glpsol's output with select(), which fails on descriptors ≥ 1024 (an
    # executor serving a thousand pilots holds as many sockets); its other reader, a blocking
    # read per stream, has no such limit.
    pyomo_tee._peek_available = False
    solver = SolverFactory("glpk", executable=shutil.which(GLPSOL))
    if time_limit is not None:
        # glpsol takes whole seconds; never round a positive limit down to 0 ("stop at once").
        solver.options["tmlim"] = max(0, math.ceil(time_limit)) if time_limit > 0 else 0
    return solver


def _run(built: _Built, time_limit: float | None) -> SolveStatus | None:
    """Solve the active objective; load and classify the result (None: no solution)."""
    try:
        results = _glpk(time_limit).solve(built.model, load_solutions=False)
    except ApplicationError as exc:  # glpsol aborted (e.g. a numerical failure)
        log.warning("GLPK failed, using the exact program instead: %s", exc)
        return None
    cond = results.solver.termination_condition
    if cond not in (TerminationCondition.optimal, TerminationCondition.feasible):
        return None
    if len(results.solution) == 0:
        return None
    built.model.solutions.load_from(results)
    return SolveStatus.OPTIMAL if cond is TerminationCondition.optimal else SolveStatus.FEASIBLE


def _counts(built: _Built) -> tuple[dict[str, int], float]:
    """The loaded solution's counts, and their objective value from the exact gain tables."""
    m = built.model
    counts = {t.task_id: 0 for t in built.tables}
    for i, (j, r) in enumerate(built.runs):
        if round(pyo.value(m.y[i])) == 1:
            n = r.lo + (round(pyo.value(m.d[i])) if r.hi > r.lo else 0)
            counts[built.tables[j].task_id] = int(n)
    total = sum(float(t.gain[np.searchsorted(t.counts, counts[t.task_id])]) for t in built.tables)
    return counts, total


def solve_milp(problem: AllocationProblem, time_limit: float | None = 10.0) -> Allocation:
    """Optimal counts from the MILP; see the module docstring for time-out behaviour.

    ``time_limit`` is GLPK's limit in seconds, rounded up to whole seconds as glpsol
    requires; ``0`` asks GLPK to stop at once.
    """
    start = time.perf_counter()
    built = build_model(problem)
    status = _run(built, time_limit)
    if status is SolveStatus.OPTIMAL:
        counts, total = _counts(built)
    else:
        # Not proven (the time limit, or glpsol failed): the exact program costs little next to
        # that limit, up to the size at which it takes seconds itself (then an incumbent stands).
        incumbent = _counts(built) if status is not None else None
        check = incumbent is None or problem.exact_work <= MAX_EXACT_WORK
        counts, total, status = at_time_limit(incumbent, solve_exact(problem) if check else None)
    return Allocation(
        status=status, objective=total, counts=counts, solve_s=time.perf_counter() - start
    )


def at_time_limit(
    incumbent: tuple[dict[str, int], float] | None, exact: Allocation | None
) -> tuple[dict[str, int], float, SolveStatus]:
    """The plan to act on when GLPK stopped at its limit: its ``incumbent`` (counts, objective;
    None: it had none) unless the ``exact`` program's optimum (None: not computed) is better,
    since a worse plan is a worse decision for as long as it stands."""
    if incumbent is not None:
        counts, total = incumbent
        if exact is None or total >= exact.objective - REL_TOL * max(1.0, abs(exact.objective)):
            return counts, total, SolveStatus.FEASIBLE
    if exact is None:
        raise ValueError("neither an incumbent nor the exact program's plan")
    return dict(exact.counts), exact.objective, SolveStatus.FALLBACK
