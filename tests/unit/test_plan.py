"""Counts → nodes: no node in two tasks, no swaps, counts respected, preempted nodes unused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsl_bf.allocation import Action, PlanError, plan


@st.composite
def situations(draw):
    """Tasks holding disjoint node sets, free nodes, a preempted subset and feasible counts."""
    n_nodes = draw(st.integers(0, 30))
    nodes = [f"nid{i:03d}" for i in range(n_nodes)]
    n_tasks = draw(st.integers(1, 6))
    owner = [draw(st.integers(-1, n_tasks - 1)) for _ in nodes]  # -1: free
    current = {
        f"t{j}": [x for x, o in zip(nodes, owner, strict=True) if o == j] for j in range(n_tasks)
    }
    free = [x for x, o in zip(nodes, owner, strict=True) if o == -1]
    preempted = draw(st.sets(st.sampled_from(nodes))) if nodes else set()
    budget = n_nodes - len(preempted)
    counts = {}
    for tid in current:
        counts[tid] = draw(st.integers(0, max(0, budget)))
        budget -= counts[tid]
    value = draw(st.none() | st.fixed_dictionaries({x: st.floats(0, 3600) for x in nodes}))
    return current, free, preempted, counts, value


@settings(max_examples=300, deadline=None)
@given(situations())
def test_plan_invariants(situation) -> None:
    current, free, preempted, counts, value = situation
    result = plan(counts, current, free, preempted=preempted, node_value=value)
    seen: set[str] = set()
    for tid, tp in result.tasks.items():
        after = set(tp.nodes)
        assert len(after) == len(tp.nodes) == counts[tid]
        assert not after & seen, "a node is in two tasks"
        assert not after & preempted, "a preempted node was assigned"
        seen |= after
        before = set(current[tid]) - preempted
        assert set(tp.keep) | set(tp.release) == before
        # No migration: a task that takes nodes releases none, and the reverse.
        assert not (tp.add and tp.release)
        assert set(tp.keep) <= before and not set(tp.add) & before
    available = (set(free) | {x for ns in current.values() for x in ns}) - preempted
    assert seen | set(result.idle) == available
    assert not seen & set(result.idle)
    assert set(result.lost) == preempted


def test_growers_take_free_nodes_before_released_ones_and_best_first() -> None:
    current = {"a": ["n1", "n2", "n3"], "b": ["n4"]}
    value = {"n1": 10, "n2": 500, "n3": 20, "n4": 5, "n5": 100, "n6": 900}
    result = plan({"a": 1, "b": 3}, current, ["n5", "n6"], node_value=value)
    assert result.tasks["a"].keep == ("n2",)  # shrink keeps the longest-lived node
    assert result.tasks["a"].action is Action.SHRINK
    assert result.tasks["b"].add == ("n6", "n5")  # free nodes first, most valuable first
    assert result.grows == ["b"] and result.shrinks == ["a"]
    assert set(result.idle) == {"n1", "n3"}


def test_the_grower_that_will_hold_most_takes_the_longest_lived_nodes() -> None:
    # A node's departure stops its whole task, and a larger task's restart costs more: with node
    # values, b (growing to 2) chooses before a (to 1) whatever the caller's order; without
    # them, the caller's order stands.
    value = {"n1": 10, "n2": 100, "n3": 50}
    free = ["n2", "n1", "n3"]
    result = plan({"a": 1, "b": 2}, {"a": [], "b": []}, free, node_value=value)
    assert result.tasks["b"].add == ("n2", "n3") and result.tasks["a"].add == ("n1",)
    plain = plan({"a": 1, "b": 2}, {"a": [], "b": []}, free)
    assert plain.tasks["a"].add == ("n2",) and plain.tasks["b"].add == ("n1", "n3")
    unordered = plan({"a": 1, "b": 1}, {"a": [], "b": []}, ["n1", "n2"], node_value=value)
    assert unordered.tasks["a"].add == ("n2",)  # equal counts: the caller's order


def test_starts_stops_and_preemption() -> None:
    result = plan({"a": 0, "b": 2, "c": 0}, {"a": ["x", "y"], "c": ["z"]}, [], preempted=["z"])
    assert result.stops == ["a"] and result.starts == ["b"]
    assert result.tasks["b"].nodes == ("x", "y")  # a's released nodes go to b
    assert result.tasks["c"].action is Action.IDLE  # its only node was preempted
    assert result.lost == ("z",)
    with pytest.raises(PlanError, match="need 1 more"):
        plan({"c": 1}, {"c": ["z"]}, [], preempted=["z"])


@pytest.mark.parametrize(
    ("counts", "current", "free", "message"),
    [
        ({"a": 3}, {"a": ["x"]}, ["y"], "need 2 more nodes, only 1"),
        ({"a": 1, "b": 1}, {"a": ["x"], "b": ["x"]}, [], "held by both"),
        ({"a": 1}, {"a": ["x"]}, ["x"], "listed free but held"),
        ({"a": -1}, {}, ["x"], "negative count"),
    ],
)
def test_plan_errors(counts, current, free, message) -> None:
    with pytest.raises(PlanError, match=message):
        plan(counts, current, free)
