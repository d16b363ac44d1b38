"""Pure allocation: which node count each elastic task gets at an event, and which nodes.

Plain data in, plain data out, no I/O but running GLPK. Entry point: :func:`allocate`.
"""

from __future__ import annotations

from typing import Literal

from .errors import AllocationError, AllocationInputError, PlanError, SolverUnavailableError
from .exact import solve_exact
from .gains import affine_runs, gain_table, score
from .milp import solve_milp
from .plan import Action, NodePlan, TaskPlan, plan
from .policy import DEFAULT_SETTINGS, POLICIES, AllocatorSettings, Policy
from .spec import Allocation, AllocationProblem, Objective, SolveStatus, TaskSpec

__all__ = [
    "Action",
    "Allocation",
    "AllocationError",
    "AllocationInputError",
    "AllocationProblem",
    "AllocatorSettings",
    "DEFAULT_SETTINGS",
    "NodePlan",
    "Objective",
    "PlanError",
    "POLICIES",
    "Policy",
    "SolveStatus",
    "SolverUnavailableError",
    "TaskPlan",
    "TaskSpec",
    "affine_runs",
    "allocate",
    "gain_table",
    "plan",
    "score",
    "solve_exact",
    "solve_milp",
]

Solver = Literal["milp", "exact"]


def allocate(
    problem: AllocationProblem, solver: Solver = "milp", time_limit: float | None = 10.0
) -> Allocation:
    """Node counts for ``problem``: the Pyomo/GLPK MILP (default) or the exact program."""
    if solver == "exact":
        return solve_exact(problem)
    if solver == "milp":
        return solve_milp(problem, time_limit=time_limit)
    raise AllocationInputError("solver", f"unknown solver {solver!r} (milp or exact)")
