"""The clairvoyant E_avail bound (parsl_bf.replay.bound): invariants, and optima worked by hand."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsl_bf.inputs.trace import IdleTrace, load_trace
from parsl_bf.replay import bound as bound_module
from parsl_bf.replay import simulator
from parsl_bf.replay.bound import (
    Bound,
    concave_hull,
    e_avail_bound,
    efficiency_ceiling,
    idle_profile,
    violation,
)
from parsl_bf.replay.jobsets import Job, load_job_set
from parsl_bf.replay.policies import equal_share, greedy, make_policy
from parsl_bf.replay.report import summary_table
from parsl_bf.replay.simulator import ORIGINAL_ACCOUNTING, ReplayConfig, replay

from ..traces import idle_trace

DATA = Path(__file__).resolve().parents[1] / "data"
SLACK = 1e-6  # GLPK's tolerances, with room


def _job(jid, nodes, throughput, work=1e12, submit=0.0, min_nodes=1, max_nodes=None):
    return Job(
        jid,
        "m",
        submit,
        min_nodes,
        max_nodes or nodes[-1],
        0.0,
        0.0,
        work,
        tuple(nodes),
        tuple(float(x) for x in throughput),
        tuple(float(x) for x in throughput),
    )


def _rate(job: Job, n: int) -> float:
    """The replay's throughput at n nodes (0 below min_nodes)."""
    return 0.0 if n < job.min_nodes else float(np.interp(n, job.nodes, job.throughput))


def _hull_at(job: Job, n: float) -> float:
    widths, slopes = concave_hull(job)
    x = np.concatenate(([0.0], np.cumsum(widths)))
    y = np.concatenate(([0.0], np.cumsum(widths * slopes)))
    return float(np.interp(n, x, y))


SHUFFLENET = load_job_set(DATA / "hps-shufflenet-10J.json")[0]
# Non-concave and superlinear (P(4)/4 = 100 > P(1) = 75), nothing below two nodes.
LUMPY = _job("lumpy", (0, 2, 4, 8, 16), (0, 150, 400, 700, 900), min_nodes=2)


@pytest.mark.parametrize(
    "job",
    [
        SHUFFLENET,
        LUMPY,
        dataclasses.replace(SHUFFLENET, min_nodes=3, max_nodes=40),
        _job("flat", (0, 1, 2, 8), (0, 100, 100, 100)),
        _job("nearly-flat", (0, 1, 5), (0, 1.0, 1.0000000000000002), max_nodes=5),
    ],
    ids=["shufflenet", "lumpy", "shufflenet-3..40", "flat", "nearly-flat"],
)
def test_hull_is_concave_and_covers_every_count_the_replay_can_give(job: Job) -> None:
    widths, slopes = concave_hull(job)
    assert np.all(widths > 0) and np.all(slopes > 0)
    assert np.all(np.diff(slopes) < 0)  # concave
    assert widths.sum() <= job.max_nodes
    for n in range(job.max_nodes + 1):
        assert _hull_at(job, n) >= _rate(job, n) - 1e-9 * max(1.0, _rate(job, n))
    # It is the least such hull: it touches the curve at its top.
    assert _hull_at(job, job.max_nodes) == pytest.approx(
        max(_rate(job, n) for n in range(job.max_nodes + 1))
    )


def test_efficiency_ceiling_is_one_unless_a_curve_beats_linear_scaling() -> None:
    assert efficiency_ceiling([SHUFFLENET]) == pytest.approx(1.0)
    assert efficiency_ceiling([SHUFFLENET, LUMPY]) == pytest.approx(400 / 4 / 75)


# Optima worked by hand (rescales cost nothing here, so an optimal policy reaches them).
CONCAVE4 = ((0, 1, 2, 4), (0, 100, 180, 240))


def test_one_job_on_four_nodes_runs_to_the_end() -> None:
    # Best: all 4 nodes all along, 240/s for 1000 s = 240,000 samples = 2,400 at P(1) = 100,
    # over 4 × 1000 idle node-seconds: 0.6.
    trace = idle_trace([True] * 4, [], 1000)
    jobs = [_job("a", *CONCAVE4)]
    assert e_avail_bound(trace, jobs).value == pytest.approx(0.6)
    s = replay(trace, jobs, make_policy("milp"), ReplayConfig(tfwd=100)).summary
    assert s["E_avail"] == pytest.approx(0.6)
    assert s["E_avail_bound"] == pytest.approx(0.6)
    assert s["E_avail_over_bound"] == pytest.approx(1.0)


def test_a_job_that_finishes_early_is_divided_by_the_idle_time_up_to_its_end() -> None:
    # 120,000 samples at 240/s take 500 s on the 4 nodes; a fifth node (no use: max 4) joins at
    # t = 500, the event at which the replay sees the job done. E_avail = 1,200 / (4 × 500).
    # No schedule finishes earlier, and finishing later only adds idle time: 0.6 is the optimum.
    trace = idle_trace([True] * 4 + [False], [(500, 4, True)], 1000)
    jobs = [_job("a", *CONCAVE4, work=120_000, max_nodes=4)]
    bound = e_avail_bound(trace, jobs)
    # (The bound's lenient "every job finishes" test may move its finish a hair earlier.)
    assert bound.value == pytest.approx(0.6, rel=1e-5)
    assert bound.finish_s == pytest.approx(500, abs=0.01)
    s = replay(trace, jobs, make_policy("milp"), ReplayConfig(tfwd=100)).summary
    assert s["makespan_s"] == 500 and s["E_avail"] == pytest.approx(0.6)
    assert s["E_avail_over_bound"] == pytest.approx(1.0)


def test_two_jobs_split_three_nodes_by_the_hull() -> None:
    # Slopes 100, 50, 30 per node: the best split of 3 nodes is (2, 1), 150 + 100 = 250/s:
    # 250,000 samples = 2,500 / 3,000 node-seconds.
    trace = idle_trace([True] * 3, [], 1000)
    jobs = [_job(x, (0, 1, 2, 3), (0, 100, 150, 180)) for x in "ab"]
    assert e_avail_bound(trace, jobs).value == pytest.approx(2500 / 3000)
    s = replay(trace, jobs, make_policy("milp"), ReplayConfig(tfwd=100)).summary
    assert s["E_avail"] == pytest.approx(2500 / 3000)
    # Equal share, as the original's code does it: a share of ⌊3/2⌋ = 1 = min_nodes gives 0,
    # and the leftovers go first come first served: all 3 to a, 180/s, below the bound.
    s = replay(trace, jobs, equal_share, ReplayConfig(tfwd=100)).summary
    assert s["E_avail"] == pytest.approx(1800 / 3000)


def test_a_job_counts_only_from_its_submission() -> None:
    # Two nodes from 0, a third from t = 400, when b is submitted. Curve (0, 100, 150) per
    # 0/1/2 nodes, max 2. [0, 400): a alone on 2 nodes, 150/s; [400, 1000): 2 + 1 nodes,
    # 250/s. (60,000 + 150,000) / 100 = 2,100 over 2 × 400 + 3 × 600 = 2,600 node-seconds.
    # (Were b free to start at 0, the bound would be 2,500 / 2,600.)
    trace = idle_trace([True, True, False], [(400, 2, True)], 1000)
    jobs = [_job("a", (0, 1, 2), (0, 100, 150)), _job("b", (0, 1, 2), (0, 100, 150), submit=400)]
    assert e_avail_bound(trace, jobs).value == pytest.approx(2100 / 2600)
    s = replay(trace, jobs, make_policy("milp"), ReplayConfig(tfwd=100)).summary
    assert s["E_avail"] == pytest.approx(2100 / 2600)


def test_superlinear_curves_can_pass_one_and_so_can_the_bound() -> None:
    # 2 nodes give 3× one node's rate: E_avail = 300 × 1000 / 100 / 2000 = 1.5, the ceiling.
    trace = idle_trace([True, True], [], 1000)
    jobs = [_job("a", (0, 1, 2), (0, 100, 300))]
    s = replay(trace, jobs, make_policy("milp"), ReplayConfig(tfwd=100)).summary
    assert s["E_avail"] == pytest.approx(1.5)
    assert s["E_avail_bound"] == pytest.approx(1.5) == efficiency_ceiling(jobs)


# Small instances on the first nodes of the dev week (tests/data/trace64): shufflenet jobs with
# their work and submission gaps scaled down, plus a lumpy superlinear curve. Each entry:
# nodes, window start (h), length (h), work scale, submit gap scale, max_jobs, charge_starts,
# lumpy jobs.
INSTANCES = {
    "16n-finishes": (16, 42, 4, 0.05, 0.25, 10, False, False),
    "64n-finishes": (64, 0, 3, 0.02, 0.25, 10, False, False),
    "64n-to-end-3-jobs": (64, 150, 2, 1.0, 0.1, 3, True, False),
    "32n-to-end-lumpy": (32, 60, 3, 0.3, 0.1, 4, True, True),
}


@cache
def _instance(name: str) -> tuple[IdleTrace, tuple[Job, ...], ReplayConfig]:
    nodes, start_h, hours, work, gaps, max_jobs, charge, lumpy = INSTANCES[name]
    start = start_h * 3600
    jobs = []
    for i, job in enumerate(load_job_set(DATA / "hps-shufflenet-10J.json")):
        if lumpy and i % 2:
            job = dataclasses.replace(
                LUMPY,
                id=job.id,
                submit_s=job.submit_s,
                work=job.work,
                rescale_up_s=18.0,
                rescale_down_s=12.0,
            )
        jobs.append(
            dataclasses.replace(job, work=job.work * work, submit_s=start + job.submit_s * gaps)
        )
    config = ReplayConfig(
        start_s=start,
        end_s=start + hours * 3600,
        max_jobs=max_jobs,
        charge_starts=charge,
        bound_buckets=0,  # the bound is computed once per instance, below
    )
    return load_trace(DATA / "trace64", nodes), tuple(jobs), config


@cache
def _bound(name: str, buckets: int = 240, limit: bool = True) -> Bound:
    trace, jobs, config = _instance(name)
    max_jobs = config.max_jobs if limit else None
    return e_avail_bound(trace, jobs, config.start_s, config.end_s, buckets, max_jobs=max_jobs)


POLICIES = {"milp": make_policy("milp"), "equal-share": equal_share, "greedy": greedy}


@pytest.mark.parametrize("tfwd", [60.0, 600.0])
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_no_policy_beats_the_bound(name: str, policy: str, tfwd: float) -> None:
    trace, jobs, config = _instance(name)
    s = replay(trace, jobs, POLICIES[policy], dataclasses.replace(config, tfwd=tfwd)).summary
    bound = _bound(name)
    assert bound.value is not None and bound.note is None
    assert s["E_avail"] <= bound.value * (1 + SLACK)
    assert violation(s["E_avail"], bound.value) is None
    assert bound.value <= efficiency_ceiling(jobs) * (1 + SLACK)
    if bound.finish_s is not None:  # a replay that finishes cannot finish before the relaxation
        assert s["makespan_s"] is None or config.start_s + s["makespan_s"] >= bound.finish_s


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_the_original_accounting_has_its_own_bound(name: str) -> None:
    # Without task events a replay stops, and admits, at trace events only: the bound that
    # knows it holds, and so does the one that does not (a relaxation of it). Their buckets
    # differ (with task events the submissions are edges), so neither LP is nested in the other.
    trace, jobs, config = _instance(name)
    original = dataclasses.replace(config, **ORIGINAL_ACCOUNTING, bound_buckets=240)
    s = replay(trace, jobs, POLICIES["milp"], original).summary
    args = (trace, jobs, config.start_s, config.end_s, 240)
    at_events = e_avail_bound(*args, max_jobs=config.max_jobs, task_events=False)
    anytime = e_avail_bound(*args, max_jobs=config.max_jobs)
    assert at_events.value is not None and anytime.value is not None
    assert s["E_avail_bound"] == pytest.approx(at_events.value)
    assert violation(s["E_avail"], at_events.value) is None
    assert violation(s["E_avail"], anytime.value) is None


def test_the_admission_limit_tightens_the_bound_and_it_still_holds() -> None:
    # 3 of 10 jobs at a time on 64 nodes: at most 3 × 64 nodes in use, and at most 3 jobs
    # sharing them. The limit only tightens (the LP without it is a relaxation of the LP with).
    name = "64n-to-end-3-jobs"
    limited, free = _bound(name).value, _bound(name, limit=False).value
    assert limited < free * (1 - 1e-3)
    trace, jobs, config = _instance(name)
    for policy in POLICIES.values():
        s = replay(trace, jobs, policy, dataclasses.replace(config, tfwd=60.0)).summary
        assert s["E_avail"] <= limited * (1 + SLACK)


def test_the_bound_follows_the_queues_order() -> None:
    # Ten jobs that barely scale and ten that scale linearly, two slots, eight nodes (a ninth
    # comes and goes, so that the replay has events to admit at). First come first served, the
    # replay must work through the queue's head before it reaches the rest; the bound now
    # knows that, so a queue that starts with the poor scalers has a lower bound than the
    # same jobs with the scalable ones first, and no policy beats either.
    trace = idle_trace(
        [True] * 8 + [False], [(t, 8, t % 100 == 0) for t in range(50, 1000, 50)], 1000
    )
    poor = ((0, 1, 2, 4, 8), (0, 100, 110, 120, 125))
    linear = ((0, 1, 2, 4, 8), (0, 100, 200, 400, 800))

    def queue(order: str) -> list[Job]:
        return [
            _job(f"{k}{i}", *(poor if k == "p" else linear), work=40_000, max_nodes=8)
            for i, k in enumerate(order)
        ]

    config = ReplayConfig(tfwd=100, max_jobs=2)
    bounds = {}
    for order in ("p" * 10 + "l" * 10, "l" * 10 + "p" * 10, "pl" * 10):
        jobs = queue(order)
        bounds[order] = e_avail_bound(trace, jobs, max_jobs=config.max_jobs).value
        for policy in POLICIES.values():
            s = replay(trace, jobs, policy, config).summary
            assert s["E_avail"] <= bounds[order] * (1 + SLACK)
    assert bounds["p" * 10 + "l" * 10] < bounds["l" * 10 + "p" * 10] * (1 - 1e-2)
    assert bounds["pl" * 10] < bounds["l" * 10 + "p" * 10] * (1 - 1e-2)


def test_a_job_holds_its_slot_until_it_is_done() -> None:
    # One slot, two jobs submitted at the start: a poor scaler first, far from done at the end,
    # then a linear one that could finish in a tenth of the window. First come first served,
    # the second is never admitted: the best any replay does is the first job on all 8 nodes,
    # 1.25 node-equivalents a second over 8 idle nodes. A bound that let the slot go to the
    # second job for a while (between the queue's checkpoints) would count its work too.
    trace = idle_trace(
        [True] * 8 + [False], [(t, 8, t % 100 == 0) for t in range(50, 1000, 50)], 1000
    )
    poor = _job("poor", (0, 1, 2, 4, 8), (0, 100, 110, 120, 125), work=1e9)
    linear = _job("linear", (0, 1, 2, 4, 8), (0, 100, 200, 400, 800), work=80_000)
    bound = e_avail_bound(trace, [poor, linear], max_jobs=1)
    best = 125 / 100 * 1000 / (8 * 1000 + 500)  # the ninth node is idle half the time
    assert bound.value is not None and bound.value < best * 1.01
    for policy in POLICIES.values():
        s = replay(trace, [poor, linear], policy, ReplayConfig(tfwd=100, max_jobs=1)).summary
        assert s["jobs_admitted"] == 1
        assert s["E_avail"] <= bound.value * (1 + SLACK)


def test_a_nearly_flat_curve_still_gets_a_bound(monkeypatch) -> None:
    # Found by the random instances below: a hull piece with a slope 1e-16 of the one before it
    # made GLPK's simplex run to its time limit on three nodes and three jobs, so no bound.
    trace = idle_trace(
        [False, False, True],
        [
            (12, 0, False),
            (49, 2, False),
            (284, 0, True),
            (309, 0, True),
            (365, 0, True),
            (373, 0, False),
            (413, 2, False),
            (427, 0, False),
            (544, 1, False),
            (556, 2, False),
            (641, 0, False),
            (1077, 2, True),
        ],
        1673,
    )
    jobs = [
        _job(
            "a",
            (0, 1, 5),
            (0, 139.31766065295628, 157.79655846497707),
            work=427868.62496584235,
            min_nodes=3,
            max_nodes=5,
        ),
        _job(
            "b",
            (0, 1, 5),
            (0, 1.0, 1.0000000000000002),
            work=1e5,
            submit=125.0,
            min_nodes=3,
            max_nodes=5,
        ),
        _job(
            "c",
            (0, 1, 6),
            (0, 3.6564353592125807, 24.296441874667902),
            work=1e5,
            submit=199.0,
            min_nodes=4,
            max_nodes=6,
        ),
    ]
    monkeypatch.setattr(bound_module, "MAX_VARIABLES", 1)
    bound = e_avail_bound(trace, jobs, 0, None, 5, max_jobs=1)
    assert bound.value is not None, bound.note
    for policy in POLICIES.values():
        s = replay(trace, jobs, policy, ReplayConfig(tfwd=20, max_jobs=1, bound_buckets=5))
        assert s.summary["E_avail"] <= bound.value * (1 + SLACK)


def _fresh_bound(name: str) -> Bound:  # not cached: the tests below patch the solver
    trace, jobs, config = _instance(name)
    return e_avail_bound(trace, jobs, config.start_s, config.end_s, max_jobs=config.max_jobs)


def test_a_bound_that_times_out_is_solved_again_on_coarser_buckets(monkeypatch) -> None:
    # GLPK's time limit 0 means "stop at once": the first LP times out for real (the real
    # glpsol), the next ones get the usual limit. Half the buckets: a relaxation of the grid.
    real, limits = bound_module._glpk, iter([0.0])
    monkeypatch.setattr(bound_module, "_glpk", lambda limit: real(next(limits, limit)))
    name = "64n-to-end-3-jobs"
    retried = _fresh_bound(name)
    assert retried.value is not None, retried.note
    assert retried.buckets < _bound(name).buckets and retried.solves > _bound(name).solves
    assert retried.value >= _bound(name).value * (1 - SLACK)


def test_a_bound_that_times_out_at_the_coarsest_buckets_is_none(monkeypatch) -> None:
    monkeypatch.setattr(bound_module, "LP_TIME_LIMIT", 0)
    bound = _fresh_bound("64n-to-end-3-jobs")
    assert bound.value is None and "maxTimeLimit" in bound.note
    assert bound.buckets == bound_module.MIN_BUCKETS and bound.solves > 1


@pytest.mark.parametrize("budget, checkpoints", [(80, 8), (30, 3), (9, 0)])
def test_more_jobs_get_fewer_queue_checkpoints_and_still_a_bound(
    monkeypatch, budget: int, checkpoints: int
) -> None:
    # The queue's variables grow with the jobs (a job set may hold a million): past
    # QUEUE_VARIABLES the checkpoints thin out, then go. Each set of them is a bound, and none
    # at all relaxes every set.
    name = "64n-to-end-3-jobs"  # 10 jobs, 3 slots
    monkeypatch.setattr(bound_module, "QUEUE_VARIABLES", budget)
    bound = _fresh_bound(name)
    assert bound.checkpoints == checkpoints and bound.to_dict()["queue_checkpoints"] == checkpoints
    if checkpoints == 0:
        assert bound.value >= _bound(name).value * (1 - SLACK)
    trace, jobs, config = _instance(name)
    for policy in POLICIES.values():
        s = replay(trace, jobs, policy, dataclasses.replace(config, tfwd=60.0)).summary
        assert s["E_avail"] <= bound.value * (1 + SLACK)


@pytest.mark.parametrize("count, checkpoints", [(20_000, 1), (30_000, 0)])
def test_tens_of_thousands_of_jobs_get_an_exact_bound(count: int, checkpoints: int) -> None:
    # One slot and one-node jobs: at most one of the two idle nodes is ever used, so 0.5. The
    # queue's terms stay linear in the jobs (one sum per checkpoint and class), and the jobs'
    # availability is computed without a jobs × buckets matrix.
    jobs = [_job(f"j{i}", (0, 1), (0, 1), work=1.0) for i in range(count)]
    bound = e_avail_bound(idle_trace([True, True], [], 1000), jobs, max_jobs=1)
    assert bound.checkpoints == checkpoints
    assert bound.value == pytest.approx(0.5)


def test_pooling_identical_jobs_only_relaxes(monkeypatch) -> None:
    # Too many columns: the ten identical shufflenet jobs become one class, their work caps one
    # cap on what has been submitted so far. The same buckets, a weaker but valid bound.
    name = "16n-finishes"
    trace, jobs, config = _instance(name)
    monkeypatch.setattr(bound_module, "MAX_VARIABLES", 1000)
    pooled = e_avail_bound(trace, jobs, config.start_s, config.end_s, 240)
    assert pooled.buckets == _bound(name).buckets and pooled.variables < _bound(name).variables
    assert pooled.value >= _bound(name).value * (1 - SLACK)
    for policy in POLICIES.values():
        s = replay(trace, jobs, policy, dataclasses.replace(config, tfwd=60.0)).summary
        assert s["E_avail"] <= pooled.value * (1 + SLACK)


def test_the_bound_is_at_most_one_for_curves_that_never_beat_linear_scaling() -> None:
    for name in INSTANCES:
        _, jobs, _ = _instance(name)
        if efficiency_ceiling(jobs) <= 1 + 1e-12:
            assert _bound(name).value <= 1 + SLACK


@pytest.mark.parametrize("name", ["16n-finishes", "64n-to-end-3-jobs"])
def test_finer_buckets_never_loosen_the_bound(name: str) -> None:
    # The buckets are merged bottom-up, so fewer buckets are unions of more: a relaxation.
    values = [_bound(name, b).value for b in (24, 60, 120, 10**6)]  # 10**6: the trace's steps
    assert all(b <= a * (1 + SLACK) for a, b in zip(values, values[1:], strict=False))


def test_more_idle_nodes_never_lower_the_samples_the_bound_allows() -> None:
    # The first 16 nodes are a subset of the first 32, so the capacity only grows: the LP's
    # samples (the bound times its idle node-seconds) cannot fall. Work large enough that no
    # one finishes, so the bound divides by the window's idle node-seconds.
    bounds = []
    for nodes in (8, 16, 32, 64):
        trace = load_trace(DATA / "trace64", nodes)
        _, jobs, config = _instance("32n-to-end-lumpy")
        jobs = [dataclasses.replace(j, work=j.work * 100) for j in jobs]
        bounds.append(e_avail_bound(trace, jobs, config.start_s, config.end_s))
    samples = [b.value * b.idle_node_s for b in bounds]
    assert all(b.finish_s is None for b in bounds)
    assert all(y >= x * (1 - SLACK) for x, y in zip(samples, samples[1:], strict=False))


def test_the_ratio_itself_can_fall_with_more_idle_nodes() -> None:
    # E_avail divides by every idle node-second, used or not: a one-node job reaches 1 on one
    # idle node, and at most 1/2 on two. So only the samples bound is monotone in capacity.
    job = [_job("a", (0, 1), (0, 100))]
    one = e_avail_bound(idle_trace([True, False], [], 100), job).value
    two = e_avail_bound(idle_trace([True, True], [], 100), job).value
    assert one == pytest.approx(1.0) and two == pytest.approx(0.5)


def test_the_bound_divides_by_the_replays_idle_node_seconds() -> None:
    trace, jobs, config = _instance("16n-finishes")
    s = replay(trace, jobs, greedy, dataclasses.replace(config, bound_buckets=60)).summary
    profile = idle_profile(trace, config.start_s, config.end_s)
    assert profile.node_s(config.start_s + s["replayed_s"]) == pytest.approx(s["idle_node_s"])
    assert "bound_violation" not in s
    assert 0 < s["E_avail_over_bound"] <= 1
    assert s["bound"]["buckets"] <= 60 + len(jobs) and s["bound"]["lp_solves"] >= 1
    table = summary_table(s)
    assert "E_avail bound" in table and "E_avail ÷ bound" in table
    in_place = sum(v["count"] for k, v in s["rescales_by_kind"].items() if "in_place" in k)
    shrunk = s["preemptions_by_kind"].get("in_place", {}).get("count", 0)
    (row,) = [line for line in table.splitlines() if line.startswith("of which in place")]
    assert row.split()[-3:] == [str(in_place), "/", str(shrunk)]


def test_a_replay_above_its_bound_is_flagged_not_reported(monkeypatch) -> None:
    trace = idle_trace([True] * 4, [], 1000)
    jobs = [_job("a", *CONCAVE4)]
    monkeypatch.setattr(
        simulator, "e_avail_bound", lambda *a, **k: Bound(0.3, 4000.0, None, solves=1)
    )
    s = replay(trace, jobs, make_policy("milp"), ReplayConfig(tfwd=100)).summary
    assert s["E_avail"] == pytest.approx(0.6) and s["E_avail_bound"] == 0.3
    assert s["E_avail_over_bound"] is None and "exceeds its upper bound" in s["bound_violation"]
    assert "a bug" in summary_table(s)
    assert violation(0.6, 0.6 * (1 + 1e-9)) is None and violation(None, 0.5) is None


def test_bound_can_be_left_out_and_an_empty_window_has_none() -> None:
    trace = idle_trace([True, False], [], 100)
    s = replay(trace, [_job("a", (0, 1), (0, 100))], greedy, ReplayConfig(bound_buckets=0))
    assert s.summary["E_avail_bound"] is None and s.summary["E_avail_over_bound"] is None
    nothing = e_avail_bound(idle_trace([False], [], 100), [_job("a", (0, 1), (0, 100))])
    assert nothing.value is None and "no idle" in nothing.note


@st.composite
def _tiny(draw):
    """A few nodes that come and go, a few jobs with any curve shape, a window and settings."""
    n, end = draw(st.integers(1, 5)), draw(st.integers(100, 2000))
    initial = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    changes = sorted(
        set(
            draw(
                st.lists(
                    st.tuples(st.integers(1, end - 1), st.integers(0, n - 1), st.booleans()),
                    max_size=12,
                )
            )
        )
    )
    jobs = []
    same = draw(st.booleans())  # one curve for all: the pooled LP (see below) pools them
    for i in range(draw(st.integers(1, 4))):
        if not (same and jobs):
            top = draw(st.integers(1, 6))
            nodes = sorted({0, top, *draw(st.lists(st.integers(1, top), max_size=3))})
            rates = [0.0] + sorted(
                draw(st.lists(st.floats(1, 500), min_size=len(nodes) - 1, max_size=len(nodes) - 1))
            )
            low = draw(st.integers(1, top))
        job = _job(
            f"j{i}",
            tuple(nodes),
            tuple(rates),
            work=draw(st.floats(1e3, 5e5)),
            submit=draw(st.sampled_from([0.0, float(draw(st.integers(0, end)))])),
            min_nodes=low,
            max_nodes=top,
        )
        up, down = draw(st.sampled_from([0.0, 5.0])), draw(st.sampled_from([0.0, 3.0]))
        jobs.append(dataclasses.replace(job, rescale_up_s=up, rescale_down_s=down))
    config = ReplayConfig(
        tfwd=draw(st.sampled_from([20.0, 500.0])),
        start_s=draw(st.sampled_from([0, end // 3])),
        max_jobs=draw(st.integers(1, 3)),
        charge_starts=draw(st.booleans()),
        bound_buckets=draw(st.sampled_from([2, 5, 240])),
    )
    return idle_trace(initial, changes, end), jobs, config, draw(st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tiny())
def test_no_policy_beats_the_bound_on_random_tiny_instances(instance) -> None:
    trace, jobs, config, pool = instance
    # pool: a budget of one variable, so identical jobs are pooled and the buckets coarsened.
    with mock.patch.object(
        bound_module, "MAX_VARIABLES", 1 if pool else bound_module.MAX_VARIABLES
    ):
        summaries = [
            replay(trace, jobs, policy, config).summary
            for policy in (make_policy("exact"), make_policy("milp"), equal_share, greedy)
        ]
    for s in summaries:
        assert "bound_violation" not in s, s["bound_violation"]
        if s["E_avail"] is not None:
            assert s["E_avail"] <= s["E_avail_bound"] * (1 + SLACK) + 1e-12
            assert s["E_avail_bound"] <= efficiency_ceiling(jobs) * (1 + SLACK)
