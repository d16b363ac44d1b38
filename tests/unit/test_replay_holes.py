"""The scheduler's planned hole ends in the replay (parsl_bf.replay.holes): the plan's model,
and how the replay uses it, on hand-made traces."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from parsl_bf.inputs.trace import load_trace
from parsl_bf.replay.holes import HoleForecast, planned_ends
from parsl_bf.replay.jobsets import Job
from parsl_bf.replay.policies import make_policy
from parsl_bf.replay.simulator import ReplayConfig, replay

from ..traces import idle_trace

DATA = Path(__file__).resolve().parents[1] / "data"


def _job(max_nodes: int, up: float = 10.0, down: float = 5.0, jid: str = "a") -> Job:
    return Job(
        jid, "linear", 0.0, 1, max_nodes, up, down, 1e12, (0, 1, 4), (0.0, 100.0, 400.0),
        (0.0, 100.0, 400.0),
    )  # fmt: skip


def _true_holes(trace) -> dict[tuple[int, int], float]:
    """(node, opened) → true end, from the trace's states step by step (inf: still open)."""
    out: dict[tuple[int, int], float] = {}
    opened = {x: 0 for x in np.flatnonzero(trace.initial).tolist()}
    for t, nodes, idle in trace.batches():
        for x, now_idle in zip(nodes.tolist(), idle.tolist(), strict=True):
            if now_idle:
                opened[x] = t
            elif x in opened:
                out[(x, opened.pop(x))] = float(t)
    out.update({(x, o): math.inf for x, o in opened.items()})
    return out


def test_exact_walltimes_plan_every_hole_at_its_true_end() -> None:
    trace = load_trace(DATA / "trace64", 16)
    truth = _true_holes(trace)
    assert planned_ends(trace, HoleForecast()) == truth
    assert any(math.isinf(e) for e in truth.values()) and any(
        math.isfinite(e) for e in truth.values()
    )


def test_a_plan_is_never_early_and_is_late_by_at_most_its_accuracy() -> None:
    trace = load_trace(DATA / "trace64", 16)
    truth = _true_holes(trace)
    plan = planned_ends(trace, HoleForecast(0.25, 0.5, seed=3))
    assert plan.keys() == truth.keys()
    late = 0
    for (x, o), end in truth.items():
        if math.isinf(end):
            assert math.isinf(plan[(x, o)])
            continue
        length = end - o
        assert 2 * length - 1e-9 <= plan[(x, o)] - o <= 4 * length + 1e-9
        late += plan[(x, o)] > end
    assert late > 0
    # Seeded: the same forecast gives the same plan.
    assert plan == planned_ends(trace, HoleForecast(0.25, 0.5, seed=3))


def test_unannounced_holes_have_no_end_and_an_empty_plan_changes_no_decision() -> None:
    trace = load_trace(DATA / "trace64", 16)
    plan = planned_ends(trace, HoleForecast(announced=0.0))
    assert all(math.isinf(e) for e in plan.values())
    jobs = [_job(4, jid="a"), _job(3, jid="b")]
    cfg = dict(tfwd=120.0, end_s=20_000, bound_buckets=0)
    blind = replay(trace, jobs, make_policy("milp"), ReplayConfig(**cfg))
    empty = ReplayConfig(**cfg, holes=HoleForecast(announced=0.0))
    told = replay(trace, jobs, make_policy("milp"), empty)
    assert told.task_nodes == blind.task_nodes
    assert told.summary["samples"] == blind.summary["samples"]


def test_a_grower_takes_the_node_the_plan_says_lasts() -> None:
    # Nodes 0 and 1 idle from t = 0; node 0 is taken back at t = 100, node 1 at t = 1,000.
    trace = idle_trace([True, True], [(100, 0, False), (1000, 1, False)], 2000)
    job = _job(max_nodes=1)
    blind = replay(trace, [job], make_policy("exact"), ReplayConfig(tfwd=1000, bound_buckets=0))
    told = replay(
        trace,
        [job],
        make_policy("exact"),
        ReplayConfig(tfwd=1000, bound_buckets=0, holes=HoleForecast()),
    )
    # Blind, the task takes the first free node (node 0) and is preempted at t = 100.
    assert blind.summary["preemptions"] == 2
    # Told, it takes node 1 at once and loses it only when the trace takes node 1 back.
    assert told.summary["preemptions"] == 1
    assert told.summary["samples"] > blind.summary["samples"]


def test_a_node_leaving_before_a_rescale_repays_is_not_offered() -> None:
    # Node 1 joins at t = 50 and leaves at t = 60: 10 s, less than R_up + R_down = 15 s.
    trace = idle_trace([True, False], [(50, 1, True), (60, 1, False)], 500)
    job = _job(max_nodes=4)
    told = replay(
        trace,
        [job],
        make_policy("exact"),
        ReplayConfig(tfwd=1000, bound_buckets=0, holes=HoleForecast()),
    )
    assert [c for _, c in told.task_nodes["a"]] == [0, 1]  # never grows onto node 1
    assert told.summary["preemptions"] == 0 and told.summary["rescales"] == 1
    blind = replay(trace, [job], make_policy("exact"), ReplayConfig(tfwd=1000, bound_buckets=0))
    assert [c for _, c in blind.task_nodes["a"]] == [0, 1, 2, 1]
    # An explicit floor below the hole's length offers it again.
    floor = ReplayConfig(tfwd=1000, bound_buckets=0, holes=HoleForecast(), min_node_life_s=5)
    assert [c for _, c in replay(trace, [job], make_policy("exact"), floor).task_nodes["a"]] == [
        0,
        1,
        2,
        1,
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"accuracy_low": 0.0}, "walltime accuracy"),
        ({"accuracy_low": 0.8, "accuracy_high": 0.5}, "walltime accuracy"),
        ({"accuracy_high": 1.5}, "walltime accuracy"),
        ({"announced": 1.5}, "announced"),
    ],
)
def test_a_forecast_out_of_range_is_refused(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        HoleForecast(**kwargs)
