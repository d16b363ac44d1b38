"""The replay's accounting on hand-made traces, against numbers worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest

from parsl_bf.allocation import (
    Allocation,
    AllocationProblem,
    SolveStatus,
    TaskSpec,
    solve_exact,
)
from parsl_bf.replay.jobsets import Job
from parsl_bf.replay.policies import equal_share, greedy, make_policy
from parsl_bf.replay.simulator import ReplayConfig, replay

from ..traces import idle_trace


def _job(jid="a", work=1e9, submit=0.0, up=10.0, down=5.0, max_nodes=4):
    return Job(
        jid,
        "linear",
        submit,
        1,
        max_nodes,
        up,
        down,
        work,
        (0, 1, 4),
        (0.0, 100.0, 400.0),
        (0.0, 100.0, 400.0),
    )


#: Every preemption and every planned rescale restarts the task (R_down·P(c), R_up·P(c)), as
#: in the original replayer: the charges these tests work out by hand. The rescales in place
#: have their own tests below.
RESTARTS = ReplayConfig(tfwd=1000, preemption_shrink_s=None, rescale_in_place_s=None)


def test_progress_rescale_and_preemption_charges() -> None:
    # Two idle nodes from t=0; node 1 is taken back at t=100; the window ends at t=300.
    trace = idle_trace([True, True], [(100, 1, False)], 300)
    result = replay(trace, [_job()], make_policy("exact"), RESTARTS)
    s = result.summary
    # t=0: starts on 2 nodes (rate 200; starting from 0 costs R_up·P(0) = 0).
    # t=100: 100 s × 200 = 20,000; preemption charge R_down·200 = 1,000; then on 1 node
    # (a shrink from 1 to 1 is no rescale), rate 100 for 200 s = 20,000.
    assert s["samples"] == pytest.approx(20_000 - 1_000 + 20_000)
    assert s["preemptions"] == 1 and s["rescales"] == 1
    assert s["idle_node_s"] == pytest.approx(2 * 100 + 1 * 200)
    assert s["alloc_node_s"] == pytest.approx(2 * 100 + 1 * 200)
    assert s["E_used"] == pytest.approx(39_000 / 100 / 400)
    # The charges in E_avail's units (samples / P(1) per idle node-second): the preemption
    # cost 1,000 / 100 = 10 node-equivalents of 400; with it, this linear job's E_avail is 1.
    assert s["E_avail_preemption_charges"] == pytest.approx(10 / 400)
    assert s["E_avail_rescale_charges"] == 0
    assert s["E_avail"] + s["E_avail_preemption_charges"] == pytest.approx(1.0)
    # The per-task timeline (plotted) shows the preemption, not only the allocator's changes.
    assert [c for _, c in result.task_nodes["a"]] == [0, 2, 1]


@pytest.mark.parametrize(("up", "extra"), [(10.0, 0.0), (30.0, 2_000.0)])
def test_a_preempted_task_restarts_once_at_its_new_size(up: float, extra: float) -> None:
    # Node 1 is taken back at t=100 as node 2 becomes idle. The task (2 nodes, rate 200) pays
    # the preemption R_down·P(2) = 1,000 and is grown back to 2 nodes at the same event. As in
    # the executor that is one restart: the grow costs only what R_up·P(1) exceeds 1,000 by
    # (R_up 10 s: nothing; 30 s: 2,000), and the allocator sees that, not R_up. The original's
    # accounting charges the grow apart (R_up·P(1): 1,000 or 3,000).
    trace = idle_trace([True, True, False], [(100, 1, False), (100, 2, True)], 300)
    seen = []

    def recording(problem: AllocationProblem):
        seen.append(problem)
        return solve_exact(problem)

    config = dataclasses.replace(RESTARTS, bound_buckets=0)
    result = replay(trace, [_job(up=up)], recording, config)
    assert [c for _, c in result.task_nodes["a"]] == [0, 2, 1, 2]
    restarting = seen[-1].tasks[0]
    assert (restarting.current_nodes, restarting.rescale_down_s) == (1, 0.0)
    assert restarting.rescale_up_s == pytest.approx(up - 1_000 / 100)
    s = result.summary
    assert s["preemption_loss_samples"] == pytest.approx(1_000)
    assert s["rescale_loss_samples"] == pytest.approx(extra)
    assert s["samples"] == pytest.approx(100 * 200 - 1_000 - extra + 200 * 200)
    seen.clear()
    apart = replay(trace, [_job(up=up)], recording, dataclasses.replace(config, restart_once=False))
    assert seen[-1].tasks[0].rescale_up_s == up
    assert apart.summary["rescale_loss_samples"] == pytest.approx(up * 100)


def test_a_preempted_task_whose_min_nodes_stay_shrinks_in_place() -> None:
    # Three idle nodes; node 2 is taken back at t=100. The task on 3 nodes (rate 300) keeps 2:
    # their ranks train on while the preempted one leaves, S·P(3) = 1 × 300, and the allocator
    # sees its ordinary rescale costs (no restart). With min_nodes 3 it restarts instead,
    # R_down·P(3) = 5 × 300 = 1,500, as with preemption_shrink_s None.
    trace = idle_trace([True, True, True], [(100, 2, False)], 300)
    seen = []

    def recording(problem: AllocationProblem):
        seen.append(problem)
        return solve_exact(problem)

    config = ReplayConfig(tfwd=1000, bound_buckets=0)
    s = replay(trace, [_job()], recording, config).summary
    assert s["preemptions"] == 1 and s["preemption_loss_samples"] == pytest.approx(300)
    assert s["preemptions_by_kind"] == {"in_place": {"count": 1, "E_avail_charges": 3 / 700}}
    assert s["samples"] == pytest.approx(100 * 300 - 300 + 200 * 200)
    after = seen[-1].tasks[0]  # no restart: it sees the rescales in place it would pay
    assert (after.current_nodes, after.rescale_up_s, after.rescale_down_s) == (2, 1.0, 1.0)
    for job, cfg in [
        (dataclasses.replace(_job(), min_nodes=3), config),
        (_job(), dataclasses.replace(config, preemption_shrink_s=None)),
    ]:
        restarted = replay(trace, [job], recording, cfg).summary
        assert restarted["preemption_loss_samples"] == pytest.approx(1_500)
        assert list(restarted["preemptions_by_kind"]) == ["restart_some_stay"]


def test_charge_starts_charges_a_start_from_zero_at_the_new_rate() -> None:
    # The first test's trace, with starts charged: t=0 starts on 2 nodes, R_up·P(2) = 2,000.
    trace = idle_trace([True, True], [(100, 1, False)], 300)
    config = dataclasses.replace(RESTARTS, charge_starts=True)
    s = replay(trace, [_job()], make_policy("exact"), config).summary
    assert s["samples"] == pytest.approx(20_000 - 2_000 - 1_000 + 20_000)
    assert s["rescale_loss_samples"] == pytest.approx(2_000)


def test_a_measured_start_cost_replaces_r_up_for_a_start_only() -> None:
    # As above with the job's own start cost 3 s: the start is charged 3 × P(2) = 600, the
    # preemption still R_down·P(2) = 1,000; without charge_starts a start stays free.
    trace = idle_trace([True, True], [(100, 1, False)], 300)
    job = dataclasses.replace(_job(), start_s=3.0)
    charged = dataclasses.replace(RESTARTS, charge_starts=True)
    s = replay(trace, [job], make_policy("exact"), charged).summary
    assert s["samples"] == pytest.approx(20_000 - 600 - 1_000 + 20_000)
    assert s["rescale_loss_samples"] == pytest.approx(600)
    free = replay(trace, [job], make_policy("exact"), RESTARTS).summary
    assert free["samples"] == pytest.approx(20_000 - 1_000 + 20_000)


@pytest.mark.parametrize("task_events", [True, False])
def test_growth_is_charged_at_the_current_rate_and_jobs_end_at_their_work(
    task_events: bool,
) -> None:
    # One node idle, a second joins at t=50; the next trace event is at t=400.
    trace = idle_trace([True, False], [(50, 1, True), (400, 0, False)], 1000)
    job = _job(work=5_000 + 30_000, up=10.0)
    config = ReplayConfig(tfwd=100, task_events=task_events, rescale_in_place_s=None)
    result = replay(trace, [job], make_policy("milp"), config)
    s = result.summary
    # t=50: 50 × 100 = 5,000 done; grows 1 → 2, charge R_up·P(1) = 1,000, rate 200. The work
    # is reached at 50 + (35,000 − 5,000 + 1,000) / 200 = 205 s, its own event; without
    # task events, at the t=400 event (the original replayer's accounting).
    end = 205 if task_events else 400
    assert s["jobs_done"] == 1 and s["makespan_s"] == end
    assert s["samples"] == pytest.approx(35_000)
    assert s["rescale_loss_samples"] == pytest.approx(1_000)
    assert s["alloc_node_s"] == pytest.approx(50 * 1 + (end - 50) * 2)
    assert s["E_avail_rescale_charges"] == pytest.approx(1_000 / 100 / (50 * 1 + (end - 50) * 2))
    assert s["E_avail_preemption_charges"] == 0
    assert s["E_avail"] <= s["E_avail_bound"] * (1 + 1e-6)
    assert [c for _, c in result.task_nodes["a"]] == [0, 1, 2, 0]


def test_a_grow_onto_free_nodes_is_done_in_place() -> None:
    # The growth test's trace and job, with rescales in place: the allocator sees the grow at
    # 1 s, and at t=50 the grow onto the free node pays S·P(1) = 100, not R_up·P(1) = 1,000.
    trace = idle_trace([True, False], [(50, 1, True), (400, 0, False)], 1000)
    seen = []

    def recording(problem: AllocationProblem):
        seen.append(problem)
        return solve_exact(problem)

    config = ReplayConfig(tfwd=100, bound_buckets=0)
    s = replay(trace, [_job(work=5_000 + 30_000)], recording, config).summary
    assert (seen[-1].tasks[0].rescale_up_s, seen[-1].tasks[0].rescale_down_s) == (1.0, 1.0)
    assert s["rescale_loss_samples"] == pytest.approx(100)
    assert s["rescales_by_kind"]["grow_in_place"]["count"] == 1
    assert s["makespan_s"] == 201  # its work is reached at 50 + 30,100 / 200 = 200.5 s


def _scripted(*counts: dict[str, int]):
    """A policy that answers its n-th problem with ``counts[n]`` (the last one after that)."""
    answers = list(counts)

    def policy(problem: AllocationProblem) -> Allocation:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        return Allocation(status=SolveStatus.OPTIMAL, objective=0.0, counts=answer, solve_s=0.0)

    return policy


@pytest.mark.parametrize(("a_after", "wait"), [(1, 1.0), (0, 5.0)])
def test_a_grow_onto_nodes_given_back_at_its_decision_waits_for_them(
    a_after: int, wait: float
) -> None:
    # Three idle nodes, a fourth from t=100: a holds 2, b 1; at t=100 b grows to 3 onto the new
    # node and one of a's. As in the executor, b trains on at P(1) until that node is free,
    # then grows in place: S·P(1) + wait·(P(3) − P(1)), the wait being a's shrink in place (S)
    # or its stop (its R_down, 5 s). Restarting, b would pay R_up·P(1) = 1,000.
    trace = idle_trace([True, True, True, False], [(100, 3, True)], 300)
    jobs = [_job("a", max_nodes=2), _job("b", max_nodes=3)]
    policy = _scripted({"a": 2, "b": 1}, {"a": a_after, "b": 3})
    config = ReplayConfig(tfwd=100, bound_buckets=0)
    result = replay(trace, jobs, policy, config)
    kinds = result.summary["rescales_by_kind"]
    assert kinds["grow_in_place_waits"]["count"] == 1 and "grow_restart" not in kinds
    b_charge = 1.0 * 100 + wait * (300 - 100)
    a_charge = 1.0 * 200 if a_after else 5.0 * 200  # a shrink in place, or a stop
    assert result.summary["rescale_loss_samples"] == pytest.approx(a_charge + b_charge)
    assert [c for _, c in result.task_nodes["b"]] == [0, 1, 3]
    restarts = dataclasses.replace(config, rescale_in_place_s=None)
    apart = replay(trace, jobs, _scripted({"a": 2, "b": 1}, {"a": a_after, "b": 3}), restarts)
    assert apart.summary["rescales_by_kind"]["grow_restart"]["count"] == 1
    a_restart = 5.0 * 200  # R_down·P(2), a shrink or a stop alike
    assert apart.summary["rescale_loss_samples"] == pytest.approx(a_restart + 10.0 * 100)


def test_fcfs_admission_respects_max_jobs() -> None:
    trace = idle_trace([True] * 4, [(100, 0, False), (200, 0, True)], 400)
    jobs = [_job(jid=f"j{i}", submit=10.0 * i, work=1e12) for i in range(3)]
    result = replay(trace, jobs, make_policy("milp"), ReplayConfig(tfwd=100, max_jobs=2))
    assert result.summary["jobs_admitted"] == 2
    assert set(result.task_nodes) == {"j0", "j1"}  # the first two by submission


def test_empty_window_is_an_error() -> None:
    trace = idle_trace([True], [], 100)
    with pytest.raises(ValueError, match="empty window"):
        replay(trace, [_job()], equal_share, ReplayConfig(start_s=100))


def _tasks(n, current=0):
    return [
        TaskSpec(
            id=f"t{i}",
            min_nodes=2,
            max_nodes=8,
            current_nodes=current,
            nodes=(0, 1, 4, 8),
            throughput=(0, 10, 36, 60),
            rescale_up_s=1,
            rescale_down_s=1,
        )
        for i in range(n)
    ]


def test_equal_share_splits_then_gives_leftovers_first_come_first_served() -> None:
    result = equal_share(AllocationProblem(tasks=_tasks(3), free_nodes=11, tfwd=10))
    assert result.counts == {"t0": 5, "t1": 3, "t2": 3}
    small = equal_share(AllocationProblem(tasks=_tasks(3), free_nodes=5, tfwd=10))
    assert small.counts == {"t0": 5, "t1": 0, "t2": 0}  # ⌊5/3⌋ < min: all to the first
    # A share of exactly min_nodes gives 0, as the original's code (frule) does: ⌊6/3⌋ = 2.
    even = equal_share(AllocationProblem(tasks=_tasks(3), free_nodes=6, tfwd=10))
    assert even.counts == {"t0": 6, "t1": 0, "t2": 0}


def test_greedy_is_optimal_on_concave_curves_and_not_beyond() -> None:
    concave = AllocationProblem(tasks=_tasks(3), free_nodes=13, tfwd=10)
    assert greedy(concave).objective == pytest.approx(solve_exact(concave).objective)
    assert sum(greedy(concave).counts.values()) == 13
    # A curve that only pays off at 4 nodes: one node more looks worthless to greedy.
    steep = TaskSpec(
        id="s", min_nodes=1, max_nodes=4, nodes=(0, 1, 3, 4), throughput=(0, 10, 10, 100)
    )
    problem = AllocationProblem(tasks=[steep], free_nodes=4, tfwd=10)
    assert greedy(problem).counts == {"s": 1}
    assert solve_exact(problem).counts == {"s": 4}


def test_the_remaining_work_cap_reaches_the_policy_while_no_job_waits() -> None:
    # By default each task's gain is capped at its remaining work, except while a job waits
    # for an admission slot; with cap_at_remaining_work=False (the original replayer) never.
    trace = idle_trace([True, True], [(100, 1, False)], 300)
    seen = []

    def recording(problem: AllocationProblem):
        seen.append(problem)
        return equal_share(problem)

    replay(trace, [_job(work=30_000)], recording, ReplayConfig(tfwd=1000, bound_buckets=0))
    assert seen and all(p.caps_remaining_work for p in seen)
    # 20,000 samples by t=100, less the preemption's in-place shrink (1 s × 200): 10,200 of
    # 30,000 left then.
    assert [p.tasks[0].remaining_work for p in seen] == [30_000, 10_200]
    seen.clear()
    uncapped = ReplayConfig(tfwd=1000, bound_buckets=0, cap_at_remaining_work=False)
    replay(trace, [_job(work=30_000)], recording, uncapped)
    assert seen and not any(p.caps_remaining_work for p in seen)
    # One slot, two jobs: while b waits, a's gain is not capped; once b runs alone, b's is.
    seen.clear()
    jobs = [dataclasses.replace(_job(work=10_000), id=x) for x in "ab"]
    one_slot = ReplayConfig(tfwd=1000, bound_buckets=0, max_jobs=1)
    replay(trace, jobs, recording, one_slot)
    waits = [(p.tasks[0].id, p.tasks_waiting, p.caps_remaining_work) for p in seen]
    assert waits[0] == ("a", True, False) and waits[-1] == ("b", False, True)


def test_a_completion_hands_its_nodes_to_the_next_job_at_once() -> None:
    # One slot, two nodes idle until t=1000 and no trace event before. a (40,000 samples at
    # 200/s on its 2 nodes) reaches its work at t=200, its own event: b is admitted and given
    # the nodes then, and done at t=400.
    trace = idle_trace([True, True], [], 1000)
    jobs = [dataclasses.replace(_job(work=40_000, max_nodes=2), id=x) for x in "ab"]
    config = ReplayConfig(tfwd=100, max_jobs=1, bound_buckets=0)
    result = replay(trace, jobs, make_policy("milp"), config)
    assert result.task_nodes["a"] == [(0, 0), (0, 2), (200, 0)]
    assert result.task_nodes["b"] == [(200, 0), (200, 2), (400, 0)]
    assert result.summary["makespan_s"] == 400 and result.summary["jobs_done"] == 2
    # The original's accounting looks for completions at trace events only: with none in the
    # window, a holds the slot to the end and b never starts.
    original = dataclasses.replace(config, task_events=False)
    late = replay(trace, jobs, make_policy("milp"), original)
    assert late.summary["jobs_done"] == 0 and "b" not in late.task_nodes


def test_a_job_submitted_into_a_free_slot_starts_at_its_submission() -> None:
    # b is submitted at t=150 with a slot free and no trace event until the window's end: it is
    # admitted and given a node then; in the original's accounting it waits for a trace event.
    trace = idle_trace([True, True], [], 1000)
    a = dataclasses.replace(_job(max_nodes=1), id="a")
    b = dataclasses.replace(_job(max_nodes=1, submit=150.0), id="b")
    config = ReplayConfig(tfwd=100, bound_buckets=0)
    result = replay(trace, [a, b], make_policy("milp"), config)
    assert result.task_nodes["b"] == [(150, 0), (150, 1)]
    late = replay(
        trace, [a, b], make_policy("milp"), dataclasses.replace(config, task_events=False)
    )
    assert "b" not in late.task_nodes


def test_a_rescale_is_charged_whole_from_the_next_interval_even_a_short_one() -> None:
    # The original's rule (BFTrainer-replay.py, line 73): a rescale decided at one event is
    # taken from the progress up to the next, whole, even where it exceeds it. A second node
    # joins at t=100 and the task grows 1 → 2 (R_up·P(1) = 10 × 100 = 1,000); the next event is
    # one second later (a third node, of no use at max 2), so that second's progress is
    # 1 × 200 − 1,000 = −800.
    trace = idle_trace([True, False, False], [(100, 1, True), (101, 2, True)], 300)
    job = _job(max_nodes=2)
    result = replay(trace, [job], make_policy("exact"), RESTARTS)
    at = dict(result.task_samples["a"])
    assert at[100] == pytest.approx(100 * 100)
    assert at[101] == pytest.approx(100 * 100 + 200 - 1_000)
    assert result.summary["samples"] == pytest.approx(100 * 100 + 200 * 200 - 1_000)


def test_a_rescale_below_min_nodes_is_charged_at_the_curve_in_the_original_accounting() -> None:
    # min_nodes 2: a preemption at t=100 leaves the task 1 node (it trains nothing there), and
    # node 2 becoming idle at the same event grows it back to 2. The preemption costs
    # R_down·P(2) = 5 × 200; the grow from 1 node costs R_up·P(1) = 10 × 100 in the original
    # (jobs.py, line 93: the curve, with no min_nodes test), nothing at the task's rate of 0.
    trace = idle_trace([True, True, False], [(100, 1, False), (100, 2, True)], 300)
    job = Job(
        "a",
        "linear",
        0.0,
        2,
        4,
        10.0,
        5.0,
        1e9,
        (0, 1, 2, 4),
        (0, 100, 200, 400),
        (0, 100, 200, 400),
    )
    config = dataclasses.replace(RESTARTS, restart_once=False)
    at_rate = replay(trace, [job], make_policy("exact"), config).summary
    assert at_rate["samples"] == pytest.approx(100 * 200 - 1_000 + 200 * 200)
    curve = dataclasses.replace(config, charge_curve_below_min=True)
    at_curve = replay(trace, [job], make_policy("exact"), curve).summary
    assert at_curve["samples"] == pytest.approx(100 * 200 - 1_000 + 200 * 200 - 1_000)
    assert at_curve["rescale_loss_samples"] == pytest.approx(1_000)
