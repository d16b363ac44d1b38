"""Bad input is named, solver time-outs still use the new nodes, a missing glpsol is explained."""

from __future__ import annotations

import json

import pytest

from parsl_bf.allocation import (
    Allocation,
    AllocationInputError,
    AllocationProblem,
    SolverUnavailableError,
    SolveStatus,
    TaskSpec,
    score,
    solve_exact,
    solve_milp,
)
from parsl_bf.allocation.gains import gain_tables
from parsl_bf.allocation.milp import at_time_limit
from parsl_bf.allocation.node_matrix import solve_node_matrix

TASK = {
    "id": "a",
    "min_nodes": 1,
    "max_nodes": 4,
    "current_nodes": 0,
    "nodes": [0, 1, 2, 4],
    "throughput": [0, 10, 18, 30],
    "rescale_up_s": 5,
    "rescale_down_s": 5,
}


def _instance(**task_changes) -> dict:
    return {"tfwd": 10, "free_nodes": 4, "objective": "throughput", "tasks": [TASK | task_changes]}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (_instance() | {"objective": "fastest"}, "objective"),
        (_instance(min_nodes=5), "tasks[0].min_nodes"),
        (_instance(nodes=[1, 2, 4, 8]), "tasks[0].nodes"),
        (_instance(nodes=[0, 2, 1, 4]), "tasks[0].nodes"),
        (_instance(rescale_up_s=-1), "tasks[0].rescale_up_s"),
        (_instance(throughput=[0, -1, 2, 3]), "tasks[0].throughput"),
        (_instance(throughput=[0, 1, 2]), "tasks[0].throughput"),
        (_instance(max_nodes=9), "tasks[0].max_nodes"),
        (_instance(speed=3), "tasks[0].speed"),
        (_instance() | {"tasks": []}, "tasks"),
        (_instance() | {"free_nodes": -2}, "free_nodes"),
        (_instance() | {"tfwd": 0}, "tfwd"),
    ],
)
def test_bad_input_names_the_field(data: dict, field: str) -> None:
    with pytest.raises(AllocationInputError) as info:
        AllocationProblem.from_dict(data)
    assert info.value.field == field
    assert "\n" not in str(info.value)


def test_duplicate_ids_rejected() -> None:
    with pytest.raises(AllocationInputError, match="duplicate task id"):
        AllocationProblem.from_dict(_instance() | {"tasks": [TASK, TASK]})


def _busy_problem() -> AllocationProblem:
    """Tasks holding few nodes while many are free: keeping the old map would waste them."""
    tasks = [
        TaskSpec(
            id=f"t{i}",
            min_nodes=1,
            max_nodes=64,
            current_nodes=i % 3,
            nodes=(0, 1, 2, 4, 8, 16, 32, 64),
            throughput=(0, 100 + i, 190 + i, 350, 700 - i, 1300, 2500 + 7 * i, 4000),
            rescale_up_s=15,
            rescale_down_s=10,
        )
        for i in range(60)
    ]
    return AllocationProblem(tasks=tasks, free_nodes=2000, tfwd=60)


def test_time_out_still_gives_an_optimal_plan_that_uses_the_new_nodes() -> None:
    problem = _busy_problem()
    result = solve_milp(problem, time_limit=0)  # GLPK stops at once
    assert result.status in (SolveStatus.FEASIBLE, SolveStatus.FALLBACK)
    assert sum(result.counts.values()) > sum(t.current_nodes for t in problem.tasks)
    value, _ = score(problem, result.counts)
    assert value == pytest.approx(result.objective)
    # Whether GLPK's incumbent or the exact program's plan is used, neither is worse.
    assert value == pytest.approx(solve_exact(problem).objective, rel=1e-9)


def test_at_the_time_limit_the_better_of_incumbent_and_exact_plan_is_used() -> None:
    exact = Allocation(
        status=SolveStatus.OPTIMAL, objective=10.0, counts={"a": 2, "b": 1}, solve_s=0.1
    )
    assert at_time_limit(None, exact) == ({"a": 2, "b": 1}, 10.0, SolveStatus.FALLBACK)
    worse = ({"a": 3, "b": 0}, 9.5)
    assert at_time_limit(worse, exact) == ({"a": 2, "b": 1}, 10.0, SolveStatus.FALLBACK)
    tied = ({"a": 1, "b": 2}, 10.0)  # another optimum: GLPK's stands
    assert at_time_limit(tied, exact) == ({"a": 1, "b": 2}, 10.0, SolveStatus.FEASIBLE)
    # Too large to check (the exact program was not run): the incumbent stands.
    assert at_time_limit(worse, None) == ({"a": 3, "b": 0}, 9.5, SolveStatus.FEASIBLE)


def test_missing_glpsol_is_explained(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SolverUnavailableError, match="glpk-utils"):
        solve_milp(_busy_problem())


def test_node_matrix_baseline_agrees_with_the_oracle() -> None:
    """The paper's task × node formulation reaches the same optimum on a small event."""
    tasks = [
        TaskSpec(
            id="a",
            min_nodes=1,
            max_nodes=4,
            current_nodes=2,
            nodes=(0, 1, 2, 4),
            throughput=(0, 10, 18, 30),
            rescale_up_s=5,
            rescale_down_s=5,
        ),
        TaskSpec(
            id="b",
            min_nodes=2,
            max_nodes=4,
            current_nodes=0,
            nodes=(0, 1, 2, 4),
            throughput=(0, 12, 25, 31),
            rescale_up_s=5,
            rescale_down_s=5,
        ),
        TaskSpec(
            id="c",
            min_nodes=1,
            max_nodes=3,
            current_nodes=1,
            nodes=(0, 1, 3),
            throughput=(0, 9, 40),
            rescale_up_s=30,
            rescale_down_s=5,
        ),
    ]
    for free in (0, 2, 5):
        problem = AllocationProblem(tasks=tasks, free_nodes=free, tfwd=10)
        baseline = solve_node_matrix(problem, time_limit=30)
        assert baseline.status is SolveStatus.OPTIMAL
        assert baseline.objective == pytest.approx(solve_exact(problem).objective)
        assert score(problem, baseline.counts)[0] == pytest.approx(baseline.objective)


def test_instance_json_round_trip(tmp_path) -> None:
    path = tmp_path / "i.json"
    path.write_text(json.dumps(_instance()))
    problem = AllocationProblem.from_dict(json.loads(path.read_text()))
    assert problem.capacity == 4 and problem.tasks[0].id == "a"


def test_balanced_gives_a_near_tie_to_the_task_with_more_work_left() -> None:
    # Two identical tasks, one node: throughput is indifferent, balanced is not.
    tasks = [
        TASK | {"id": "early", "remaining_work": 1e3},
        TASK | {"id": "late", "remaining_work": 5e3},
    ]
    problem = AllocationProblem.from_dict(
        {"tfwd": 10, "free_nodes": 1, "objective": "balanced", "tasks": tasks}
    )
    assert solve_milp(problem).counts == {"early": 0, "late": 1}
    assert solve_exact(problem).counts == {"early": 0, "late": 1}
    # It is a tie-breaker, not a priority: a clearly better use of the node still wins.
    faster = TASK | {"id": "early", "remaining_work": 1e3, "throughput": [0, 20, 36, 60]}
    problem = AllocationProblem.from_dict(
        {"tfwd": 10, "free_nodes": 1, "objective": "balanced", "tasks": [faster, tasks[1]]}
    )
    assert solve_milp(problem).counts == {"early": 1, "late": 0}


def test_speedup_balanced_balances_only_while_no_task_waits() -> None:
    # The task with more work left is ten times faster in samples/s: speedup, which counts
    # each task by P(n) / P(1), sees a tie, which the balance bonus breaks.
    tasks = [
        TASK | {"id": "early", "remaining_work": 1e3},
        TASK | {"id": "late", "remaining_work": 5e4, "throughput": [0, 100, 180, 300]},
    ]
    data = {"tfwd": 10, "free_nodes": 1, "objective": "speedup_balanced", "tasks": tasks}
    drained = AllocationProblem.from_dict(data)
    assert solve_milp(drained).counts == {"early": 0, "late": 1}
    assert solve_exact(drained).counts == {"early": 0, "late": 1}
    # While a task waits for a slot, the gains are speedup's, count for count.
    waiting = AllocationProblem.from_dict(data | {"tasks_waiting": True})
    speedup = AllocationProblem.from_dict(data | {"objective": "speedup"})
    for mine, plain in zip(gain_tables(waiting), gain_tables(speedup), strict=True):
        assert mine.counts.tolist() == plain.counts.tolist()
        assert mine.gain.tolist() == plain.gain.tolist()
    assert [t.gain.tolist() for t in gain_tables(drained)] != [
        t.gain.tolist() for t in gain_tables(speedup)
    ]


def test_speedup_balanced_needs_each_tasks_work_left() -> None:
    with pytest.raises(AllocationInputError) as err:
        AllocationProblem.from_dict(
            {"tfwd": 10, "free_nodes": 1, "objective": "speedup_balanced", "tasks": [TASK]}
        )
    assert "tasks[0].remaining_work: the speedup_balanced objective needs it" in str(err.value)


def test_the_remaining_work_cap_holds_only_while_no_task_waits() -> None:
    # 100 samples left at 10/s at one node: done in 10 s of a 100 s horizon. Capped, a
    # second node earns nothing (the same 100 samples, sooner) and growing only pays R_up;
    # while a task waits for the slot it would free, the gain runs on through the horizon.
    task = TASK | {"id": "ending", "remaining_work": 100.0, "current_nodes": 1}
    data = {"tfwd": 100, "free_nodes": 1, "cap_at_remaining_work": True, "tasks": [task]}
    capped = AllocationProblem.from_dict(data)
    waiting = AllocationProblem.from_dict(data | {"tasks_waiting": True})
    assert capped.caps_remaining_work and not waiting.caps_remaining_work
    (table,) = gain_tables(capped)
    assert table.gain[table.counts.tolist().index(1)] == pytest.approx(100.0)
    assert solve_milp(capped).counts == {"ending": 1}
    assert solve_milp(waiting).counts == {"ending": 2}
    # The executor caps while tasks wait too (cap_while_waiting): as if none waited.
    always = AllocationProblem.from_dict(data | {"tasks_waiting": True, "cap_while_waiting": True})
    assert always.caps_remaining_work and solve_milp(always).counts == {"ending": 1}
    # The remaining_work objective is its own cap: it holds whether or not a task waits.
    own = data | {"objective": "remaining_work", "cap_at_remaining_work": False}
    assert AllocationProblem.from_dict(own | {"tasks_waiting": True}).caps_remaining_work
