"""Hypothesis strategies for allocation instances."""

from __future__ import annotations

from hypothesis import strategies as st

from parsl_bf.allocation import AllocationProblem, Objective, TaskSpec


@st.composite
def task_specs(
    draw,
    task_id: str = "t",
    max_breakpoint: int = 12,
    first_rate: float = 0,
    known_work: bool = False,
) -> TaskSpec:
    """Any curve shape (not monotone, not concave); ``first_rate`` bounds the first rate below.

    ``known_work`` always gives a ``remaining_work`` (the balanced objective needs it).
    """
    inner = draw(st.lists(st.integers(1, max_breakpoint), min_size=1, max_size=5, unique=True))
    nodes = [0, *sorted(inner)]
    throughput = [0.0, draw(st.floats(first_rate, 1000))]
    throughput += [draw(st.floats(0, 1000)) for _ in inner[1:]]
    value = None
    if draw(st.booleans()):
        value = [0.0] + [draw(st.floats(0, 50, allow_nan=False)) for _ in inner]
    top = nodes[-1]
    min_nodes = draw(st.integers(1, min(4, top)))
    max_nodes = draw(st.integers(min_nodes, top))
    return TaskSpec(
        id=task_id,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        current_nodes=draw(st.integers(0, max_nodes + 2)),
        nodes=nodes,
        throughput=throughput,
        value=value,
        rescale_up_s=draw(st.floats(0, 30)),
        rescale_down_s=draw(st.floats(0, 30)),
        weight=draw(st.floats(0, 5)),
        remaining_work=draw((st.nothing() if known_work else st.none()) | st.floats(0, 20_000)),
    )


@st.composite
def problems(
    draw, max_tasks: int = 5, objectives=tuple(Objective), first_rate: float | None = None
) -> AllocationProblem:
    n = draw(st.integers(1, max_tasks))
    objective = draw(st.sampled_from(objectives))
    if first_rate is None:
        # speedup divides by the (interpolated) 1-node throughput: keep it well away from 0.
        first_rate = 1.0 if objective.per_speedup else 0.0
    known_work = objective in (Objective.BALANCED, Objective.SPEEDUP_BALANCED)
    tasks = [
        draw(task_specs(task_id=f"t{i}", first_rate=first_rate, known_work=known_work))
        for i in range(n)
    ]
    return AllocationProblem(
        tasks=tasks,
        free_nodes=draw(st.integers(0, 20)),
        tfwd=draw(st.floats(1, 120)),
        objective=objective,
        cap_at_remaining_work=draw(st.booleans()),
        tasks_waiting=draw(st.booleans()),
        cap_while_waiting=draw(st.booleans()),
    )
