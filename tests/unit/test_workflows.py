"""The workflows' pure parts: Latin hypercube, successive halving, Pareto front, report rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.common import (
    asha_promotions,
    dominates,
    latin_hypercube,
    log_uniform,
    pareto_front,
    pick,
    promote,
    rung_budgets,
)
from workflows.hpo_sweep import BATCHES, DEPTHS, LR, WIDTHS, leaderboard, sample_trials
from workflows.nas_sweep import sample_candidates

# --- Latin hypercube -------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "dims"), [(1, 1), (3, 4), (8, 4), (50, 3)])
def test_lhs_hits_each_stratum_once_per_dimension(n: int, dims: int) -> None:
    points = latin_hypercube(n, dims, seed=7)
    assert points.shape == (n, dims)
    assert ((points >= 0) & (points < 1)).all()
    for d in range(dims):
        strata = np.floor(points[:, d] * n).astype(int)
        assert sorted(strata.tolist()) == list(range(n))


@given(st.integers(1, 40), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_lhs_strata_property(n: int, dims: int, seed: int) -> None:
    points = latin_hypercube(n, dims, seed)
    for d in range(dims):
        assert np.bincount(np.floor(points[:, d] * n).astype(int), minlength=n).tolist() == [1] * n


def test_lhs_is_reproducible_by_seed() -> None:
    assert np.array_equal(latin_hypercube(8, 4, seed=3), latin_hypercube(8, 4, seed=3))
    assert not np.array_equal(latin_hypercube(8, 4, seed=3), latin_hypercube(8, 4, seed=4))


def test_lhs_rejects_empty_designs() -> None:
    with pytest.raises(ValueError):
        latin_hypercube(0, 2)


def test_scalings() -> None:
    assert log_uniform(0.0, 0.001, 0.1) == pytest.approx(0.001)
    assert log_uniform(0.5, 0.001, 0.1) == pytest.approx(0.01)
    assert [pick(u, "abcd") for u in (0.0, 0.24, 0.25, 0.99, 0.999999)] == list("aabdd")


def test_trials_cover_the_space_and_repeat_by_seed() -> None:
    trials = sample_trials(8, seed=0)
    assert trials == sample_trials(8, seed=0)
    assert all(LR[0] <= t["lr"] <= LR[1] for t in trials)
    # 8 strata over 4 choices: every batch size and width twice.
    assert sorted(t["global_batch"] for t in trials) == sorted(BATCHES * 2)
    assert sorted(t["width"] for t in trials) == sorted(WIDTHS * 2)
    assert {t["depth"] for t in trials} == set(DEPTHS)
    lrs = sorted(math.log(t["lr"]) for t in trials)  # log-uniform strata: one lr per 8th
    width = (math.log(LR[1]) - math.log(LR[0])) / 8
    assert [int((x - math.log(LR[0])) / width) for x in lrs] == list(range(8))


def test_nas_candidates_are_distinct() -> None:
    c = sample_candidates(12, seed=1)
    assert len({tuple(x.values()) for x in c}) == 12 and c == sample_candidates(12, seed=1)
    assert len(sample_candidates(100, seed=0)) == 24  # the whole grid


# --- successive halving ----------------------------------------------------------------------


def test_rung_budgets() -> None:
    assert rung_budgets(2000, 18000, 3) == [2000, 6000, 18000]
    assert rung_budgets(500, 1500, 3) == [500, 1500]
    assert rung_budgets(1000, 5000, 2) == [1000, 2000, 4000, 5000]
    assert rung_budgets(700, 700, 3) == [700]
    with pytest.raises(ValueError):
        rung_budgets(100, 50, 3)
    with pytest.raises(ValueError):
        rung_budgets(100, 500, 1)


def test_promote_keeps_the_top_fraction() -> None:
    scores = {0: 0.5, 1: 0.9, 2: 0.1, 3: 0.7, 4: 0.3, 5: 0.8, 6: 0.2, 7: 0.6, 8: 0.4}
    assert promote(scores, 3) == [1, 5, 3]
    assert promote(scores, 2) == [1, 5, 3, 7]
    assert promote({0: 0.2, 1: 0.4}, 3) == [1]  # always at least one


def test_promote_skips_failed_trials_and_breaks_ties_by_order() -> None:
    assert promote({0: None, 1: 0.1, 2: None}, 3) == [1]
    assert promote({0: None, 1: None, 2: None}, 3) == []
    assert promote({4: 0.5, 2: 0.5, 9: 0.5, 1: 0.2, 3: float("nan"), 5: 0.1}, 3) == [4, 2]


@given(
    st.dictionaries(
        st.integers(0, 100), st.one_of(st.none(), st.floats(0, 1)), min_size=1, max_size=30
    ),
    st.integers(2, 5),
)
def test_promoted_trials_beat_the_others(scores: dict, eta: int) -> None:
    kept = promote(scores, eta)
    valid = {k: s for k, s in scores.items() if s is not None}
    assert len(kept) == min(len(valid), max(1, len(scores) // eta))
    assert all(scores[k] >= s for k in kept for j, s in valid.items() if j not in kept)


def test_asha_promotes_without_waiting_for_the_rung() -> None:
    # Three of nine finished rung 0, six still run it: the best of the three goes on now.
    done = {0: {4: 0.2, 1: 0.9, 7: 0.5}}
    assert asha_promotions(done, {}, [0] * 6, 3, 3) == [(1, 1)]
    assert asha_promotions(done, {0: {1}}, [0] * 6 + [1], 3, 3) == []  # once only
    # Two finished, rung open: nobody is sure to be in the top third yet.
    assert asha_promotions({0: {0: 0.9, 1: 0.1}}, {}, [0], 3, 3) == []
    # Nothing runs at rung 0 any more: the rung is closed, the best always goes on.
    assert asha_promotions({0: {0: 0.9, 1: 0.1}}, {}, [], 3, 3) == [(0, 1)]
    # The last rung promotes nobody; a failed trial never goes on.
    assert asha_promotions({2: {0: 0.9}}, {}, [], 3, 3) == []
    assert asha_promotions({0: {0: None, 1: None}}, {}, [], 3, 3) == []


@given(
    st.lists(st.floats(0, 1), min_size=1, max_size=27),
    st.integers(2, 4),
    st.randoms(use_true_random=False),
)
def test_asha_run_to_the_end_reaches_the_last_rung_with_the_best(
    scores: list[float], eta: int, rng
) -> None:
    """A whole sweep, trials finishing in random order: each trial starts each rung at most
    once; each goes on only while it ranks among the best n // eta of the n that finished its
    rung (max(1, n // eta) once the rung is closed); the last rung is reached.

    Not "at most n // eta go on": a trial that ranked in time may be overtaken later, and ASHA
    does not take back a promotion."""
    rungs = 3
    done: dict[int, dict[int, float | None]] = {}
    promoted: dict[int, set[int]] = {}
    running = [(t, 0) for t in range(len(scores))]
    started = {(t, 0) for t in range(len(scores))}
    while running:
        t, r = running.pop(rng.randrange(len(running)))
        done.setdefault(r, {})[t] = scores[t]
        pending = [x for _, x in running]
        for trial, rung in asha_promotions(done, promoted, pending, eta, rungs):
            assert (trial, rung) not in started and trial in done[rung - 1]
            finished = done[rung - 1]
            closed = not any(x <= rung - 1 for x in pending)
            share = max(1, len(finished) // eta) if closed else len(finished) // eta
            better = sum(1 for s in finished.values() if s is not None and s > scores[trial])
            assert better < share, (trial, rung, finished)
            started.add((trial, rung))
            promoted.setdefault(rung - 1, set()).add(trial)
            running.append((trial, rung))
    for r in range(1, rungs):
        assert any(x == r for _, x in started)
    # The best of the first rung always goes on (one of them, on a tie).
    assert any(scores[t] == max(scores) for t, x in started if x == 1)


def test_leaderboard_ranks_by_rung_then_accuracy() -> None:
    from workflows.common import TaskResult

    def result(i: int, work: int, acc: float | None) -> TaskResult:
        if acc is None:
            return TaskResult(i, work, 1.0, error="ManagerLost: gone")
        return TaskResult(i, work, 1.0, outcome={"metrics": {"accuracy": acc}})

    trials = sample_trials(6, seed=0)
    runs = {
        0: [(0, result(0, 500, 0.8))],
        1: [(0, result(1, 500, 0.6)), (1, result(1, 1500, 0.7))],
        2: [(0, result(2, 500, None))],
        # promoted, then lost at the last rung: keeps its rung-0 result
        4: [(0, result(4, 500, 0.9)), (1, result(4, 1500, None))],
        5: [(0, result(5, 500, 0.1))],
    }
    rows = leaderboard(trials, runs, last_rung=1)
    assert [r["trial"] for r in rows] == [1, 4, 0, 5, 2, 3]
    assert [r["status"] for r in rows] == [
        "finished",
        "failed",
        "stopped",
        "stopped",
        "failed",
        "not run",
    ]
    assert rows[1]["accuracy"] == 0.9 and rows[1]["rung"] == 0 and rows[1]["work"] == 500
    assert rows[1]["error"] == "ManagerLost: gone"
    assert [r["rank"] for r in rows] == list(range(1, 7))


# --- Pareto front ----------------------------------------------------------------------------


def test_pareto_front_example() -> None:
    points = [(0.9, 1000), (0.95, 5000), (0.85, 2000), (0.95, 4000), (0.5, 100), (0.5, 100)]
    assert sorted(pareto_front(points)) == [0, 3, 4, 5]


points_strategy = st.lists(
    st.tuples(
        st.sampled_from([0.1, 0.5, 0.8, 0.9]) | st.floats(0, 1),
        st.sampled_from([100.0, 1000.0, 5000.0]) | st.floats(1, 1e6),
    ),
    max_size=40,
)


@given(points_strategy)
def test_pareto_front_property(points: list[tuple[float, float]]) -> None:
    front = set(pareto_front(points))
    assert len(front) == len(pareto_front(points))  # no index twice
    for i in front:  # no front point is dominated
        assert not any(dominates(q, points[i]) for q in points)
    for i in set(range(len(points))) - front:  # every other one is, by a front point
        assert any(dominates(points[j], points[i]) for j in front)
    assert bool(front) == bool(points)
