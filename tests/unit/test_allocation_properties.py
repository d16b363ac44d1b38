"""The MILP's optimum equals the exact program's, and the exact program equals brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings

from parsl_bf.allocation import (
    AllocationProblem,
    Objective,
    SolveStatus,
    gain_table,
    score,
    solve_exact,
    solve_milp,
)

from ..strategies import problems

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def _solver_close(problem: AllocationProblem, a: float, b: float) -> bool:
    """Equal within GLPK's tolerances. The model's gains are divided by their largest magnitude
    (``milp.build_model``), and GLPK resolves them to about 1e-7 of it: where gains and rescale
    charges of thousands cancel to a small total, two plans that differ by that much relative
    to the gains are ties to GLPK, however large the difference relative to the total."""
    scale = max(float(abs(gain_table(t, problem).gain).max()) for t in problem.tasks)
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b), scale)


def _brute_force(problem: AllocationProblem) -> tuple[float, float]:
    """Best (objective, min rate) over every combination of counts, lexicographic for fair."""
    domains = [gain_table(t, problem).counts.tolist() for t in problem.tasks]
    best: tuple[float, float] | None = None
    for combo in itertools.product(*domains):
        if sum(combo) > problem.capacity:
            continue
        value, min_rate = score(
            problem, {t.id: n for t, n in zip(problem.tasks, combo, strict=True)}
        )
        key = (min_rate, value) if problem.objective is Objective.FAIR else (value, min_rate)
        if (
            best is None
            or key[0] > best[0] + 1e-9
            or (_close(key[0], best[0]) and key[1] > best[1])
        ):
            best = key
    assert best is not None  # all-zero counts are always feasible
    return best


@SETTINGS
@given(problems(max_tasks=3))
def test_exact_program_equals_brute_force(problem: AllocationProblem) -> None:
    exact = solve_exact(problem)
    value, min_rate = score(problem, exact.counts)
    assert _close(exact.objective, value)
    best = _brute_force(problem)
    if problem.objective is Objective.FAIR:
        assert _close(min_rate, best[0]) and _close(value, best[1])
    else:
        assert _close(value, best[0])


@SETTINGS
@given(problems(max_tasks=6))
def test_milp_optimum_equals_exact(problem: AllocationProblem) -> None:
    milp = solve_milp(problem, time_limit=30)
    assert milp.status is SolveStatus.OPTIMAL
    value, min_rate = score(problem, milp.counts)  # raises if the counts are infeasible
    assert _close(milp.objective, value)
    exact = solve_exact(problem)
    exact_value, exact_min_rate = score(problem, exact.counts)
    if problem.objective is Objective.FAIR:
        assert _close(min_rate, exact_min_rate)
    assert _solver_close(problem, value, exact_value)


@pytest.mark.parametrize("objective", list(Objective))
@settings(max_examples=25, deadline=None)
@given(data=problems(max_tasks=8, first_rate=1.0))
def test_capacity_binding_and_not(objective: Objective, data: AllocationProblem) -> None:
    """The same instance with a scarce and an ample capacity, for every objective."""
    for free in (0, 200):
        problem = data.model_copy(update={"objective": objective, "free_nodes": free})
        milp, exact = solve_milp(problem), solve_exact(problem)
        assert milp.status is SolveStatus.OPTIMAL
        assert sum(milp.counts.values()) <= problem.capacity
        assert _solver_close(
            problem, score(problem, milp.counts)[0], score(problem, exact.counts)[0]
        )
