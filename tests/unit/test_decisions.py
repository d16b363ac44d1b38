"""The decisions of parsl_bf.decisions: each one's invariants, and that the places which need a
decision take it from there."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsl_bf import decisions
from parsl_bf.allocation import (
    DEFAULT_SETTINGS,
    AllocationProblem,
    AllocatorSettings,
    Objective,
    TaskSpec,
)
from parsl_bf.decisions import (
    DEFAULT_TFWD_S,
    cancel_reason,
    caps_remaining_work,
    grows_in_place,
    leaving_reason,
    resolve_tfwd,
    trains_on_in_place,
    walltime_reached,
)

counts = st.integers(min_value=0, max_value=10_000)


# --- in place ---------------------------------------------------------------------------------


@settings(deadline=None)
@given(counts, counts, counts, st.booleans(), st.booleans())
def test_a_fragment_trains_on_in_place_only_when_enough_stay(
    staying, leaving, least, enabled, task_resizes
) -> None:
    keeps = trains_on_in_place(staying, leaving, least, enabled=enabled, task_resizes=task_resizes)
    assert keeps == (enabled and task_resizes and leaving > 0 and staying >= 1 and staying >= least)


@settings(deadline=None)
@given(counts, counts, counts)
def test_more_staying_never_turns_training_on_into_a_stop(staying, leaving, least) -> None:
    # Monotone: a fragment that trains on with some nodes staying does with more, and a
    # fragment whose minimum is lower does too.
    if trains_on_in_place(staying, leaving, least):
        assert trains_on_in_place(staying + 1, leaving, least)
        assert trains_on_in_place(staying, leaving, max(0, least - 1))


@settings(deadline=None)
@given(counts, counts, st.integers(min_value=1, max_value=64))
def test_the_rule_is_the_same_in_nodes_and_in_ranks(staying, leaving, per_node) -> None:
    # The controller counts nodes against min_nodes, the ranks count ranks against their
    # --leave-min (min_nodes × ranks per node): the same decision.
    for least in range(0, 5):
        nodes = trains_on_in_place(staying, leaving, least)
        ranks = trains_on_in_place(staying * per_node, leaving * per_node, least * per_node)
        assert nodes == ranks


def test_a_task_that_cannot_resize_is_never_resized_in_place() -> None:
    assert trains_on_in_place(3, 1, 1)
    assert not trains_on_in_place(3, 1, 1, task_resizes=False)
    assert grows_in_place(1, 1)
    assert not grows_in_place(1, 1, task_resizes=False)
    assert not trains_on_in_place(3, 1, 1, enabled=False)
    assert not grows_in_place(1, 1, enabled=False)


@settings(deadline=None)
@given(counts, counts, st.booleans(), st.booleans())
def test_a_grow_in_place_needs_a_running_fragment_and_nodes_to_add(
    current, adding, enabled, task_resizes
) -> None:
    grows = grows_in_place(current, adding, enabled=enabled, task_resizes=task_resizes)
    assert grows == (enabled and task_resizes and current > 0 and adding > 0)


# --- why a pilot ended ------------------------------------------------------------------------

seconds = st.floats(min_value=0, max_value=1e7, allow_nan=False)


@settings(deadline=None)
@given(seconds, seconds, st.floats(min_value=0, max_value=600, allow_nan=False))
def test_a_walltime_end_is_a_run_that_reached_the_walltime_less_the_lead(
    ran_s, walltime_s, lead_s
) -> None:
    at = walltime_reached(ran_s, walltime_s, lead_s)
    assert at == (ran_s >= walltime_s - lead_s - decisions.WALLTIME_SLACK_S)
    if at:  # a longer run, or a longer lead, is at the walltime too
        assert walltime_reached(ran_s + 1, walltime_s, lead_s)
        assert walltime_reached(ran_s, walltime_s, lead_s + 1)


def test_without_a_walltime_no_end_is_a_walltime_end() -> None:
    assert not walltime_reached(1e9, None, 60)


def test_a_cancel_is_ours_unless_the_scheduler_signalled_first() -> None:
    assert cancel_reason(False) == "cancelled"
    assert cancel_reason(True) == "preempted"


@pytest.mark.parametrize(
    ("provider", "reason"),
    [
        ("cancelled", "cancelled"),
        ("preempted", "preempted"),
        ("walltime", "preempted"),  # the scheduler took it back: the executor's word
        ("", "preempted"),  # the provider has not polled since
        (None, "preempted"),  # a pilot the provider does not know
    ],
)
def test_the_executor_reads_the_providers_reason(provider, reason) -> None:
    assert leaving_reason(provider) == reason


# --- the allocation problem -------------------------------------------------------------------


@settings(deadline=None)
@given(st.lists(st.floats(min_value=1, max_value=1e6), max_size=20))
def test_auto_tfwd_is_the_median_hole_and_a_number_is_itself(holes) -> None:
    assert resolve_tfwd("auto", holes) == (statistics.median(holes) if holes else DEFAULT_TFWD_S)
    assert resolve_tfwd(42.0, holes) == 42.0
    # The executor's settings and the replay's trace resolve it with the same function.
    assert AllocatorSettings(tfwd="auto").lookahead(holes) == resolve_tfwd("auto", holes)


def test_the_replay_resolves_auto_as_the_executor() -> None:
    import numpy as np

    from parsl_bf.inputs.trace import IdleTrace

    # Two nodes, busy at first, idle 10-110 and 10-310: holes of 100 s and 300 s.
    trace = IdleTrace(
        nodes=("a", "b"),
        initial=np.array([False, False]),
        change_t=np.array([10, 10, 110, 310]),
        change_node=np.array([0, 1, 0, 1]),
        change_idle=np.array([True, True, False, False]),
        end_s=400,
    )
    holes = trace.hole_lengths()
    assert sorted(holes.tolist()) == [100, 300]
    assert trace.suggest_tfwd() == AllocatorSettings(tfwd="auto").lookahead(holes) == 200.0


@settings(deadline=None)
@given(st.booleans(), st.booleans(), st.booleans(), st.booleans())
def test_the_remaining_work_cap(objective_caps, cap, while_waiting, waiting) -> None:
    capped = caps_remaining_work(objective_caps, cap, while_waiting, waiting)
    assert capped == (objective_caps or (cap and (while_waiting or not waiting)))
    if cap and not waiting:  # with the cap on, no task waiting: always capped
        assert capped
    task = TaskSpec(
        id="a", min_nodes=1, max_nodes=2, current_nodes=1, nodes=(0, 1, 2),
        throughput=(0.0, 1.0, 2.0), rescale_up_s=1.0, rescale_down_s=1.0, remaining_work=10.0,
    )  # fmt: skip
    problem = AllocationProblem(
        tasks=(task,),
        free_nodes=1,
        objective=Objective.REMAINING_WORK if objective_caps else Objective.THROUGHPUT,
        cap_at_remaining_work=cap,
        cap_while_waiting=while_waiting,
        tasks_waiting=waiting,
    )
    assert problem.caps_remaining_work == capped


# --- one set of defaults ----------------------------------------------------------------------


def test_every_entry_point_takes_the_one_set_of_defaults() -> None:
    import argparse
    import inspect

    from parsl_bf.executor import BackfillExecutor
    from parsl_bf.executor.controller import Controller
    from parsl_bf.replay import cli
    from parsl_bf.replay.simulator import ReplayConfig

    assert AllocatorSettings() == DEFAULT_SETTINGS
    assert DEFAULT_SETTINGS.objective is Objective.SPEEDUP_BALANCED
    assert DEFAULT_SETTINGS.tfwd == 120.0
    assert DEFAULT_SETTINGS.shrink_in_place and DEFAULT_SETTINGS.grow_in_place
    # The replay's
    assert ReplayConfig().tfwd == resolve_tfwd(DEFAULT_SETTINGS.tfwd)
    assert ReplayConfig().objective is DEFAULT_SETTINGS.objective
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["replay"])
    assert args.objective == DEFAULT_SETTINGS.objective.value
    assert float(args.tfwd) == DEFAULT_SETTINGS.tfwd
    # The controller's and the executor's: by keyword only.
    controller = Controller()
    assert controller.allocator == DEFAULT_SETTINGS
    assert controller.shrink_in_place and controller.grow_in_place
    kinds = inspect.signature(Controller).parameters
    assert all(p.kind is p.KEYWORD_ONLY for p in kinds.values())
    executor = BackfillExecutor(label="bf")
    assert executor.allocator == DEFAULT_SETTINGS
    assert executor.controller.allocator == DEFAULT_SETTINGS
    assert inspect.signature(BackfillExecutor).parameters["allocator"].kind.name == "KEYWORD_ONLY"
    # Without warm ranks, nothing is resized in place (one mpiexec world per pilot).
    cold = BackfillExecutor(label="bf", warm_ranks=False)
    assert not cold.controller.shrink_in_place and not cold.controller.grow_in_place
