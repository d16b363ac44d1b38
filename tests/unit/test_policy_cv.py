"""The selection rule of benchmarks/policy_cv.py on small tables of made-up scores."""

from __future__ import annotations

import itertools
import random

import pytest

from ..benchmarks import benchmark


@pytest.fixture(scope="module")
def cv():
    with benchmark("policy_cv") as module:
        yield module


# "overfit" leads on a, c and d and is poor on b; "steady" is good everywhere.
TABLE = {
    "steady": {"a": 0.90, "b": 0.90, "c": 0.90, "d": 0.90},
    "overfit": {"a": 1.00, "b": 0.70, "c": 0.96, "d": 0.96},
    "weak": {"a": 0.50, "b": 0.60, "c": 0.60, "d": 0.60},
}
FOLDS = ["a", "b", "c", "d"]


def test_best_is_the_highest_mean_and_ties_go_first(cv):
    assert cv.best(TABLE, list(TABLE), FOLDS) == "overfit"  # mean 0.905 > 0.9
    assert cv.best(TABLE, list(TABLE), ["b"]) == "steady"
    tie = {"x": {"a": 0.5, "b": 0.7}, "y": {"a": 0.7, "b": 0.5}}
    assert cv.best(tie, ["x", "y"], ["a", "b"]) == "x"
    assert cv.best(tie, ["y", "x"], ["a", "b"]) == "y"
    assert cv.best(TABLE, list(TABLE), []) is None


def test_a_candidate_missing_a_training_score_does_not_compete(cv):
    table = {**TABLE, "broken": {"a": 1.0, "b": None, "c": 1.0, "d": 1.0}}
    assert cv.best(table, list(table), FOLDS) == "overfit"
    assert cv.best(table, list(table), ["a", "c"]) == "broken"
    res = cv.cross_validate(table, list(table), {f: f for f in FOLDS})
    assert res["groups"]["b"]["chosen"] == "broken"  # chosen without fold b, scored there
    assert res["heldout"]["b"] is None and res["heldout_mean"] is None


def test_leave_one_out_never_sees_the_held_out_fold(cv):
    groups = {f: f for f in FOLDS}
    res = cv.cross_validate(TABLE, list(TABLE), groups)
    # Held out, fold b goes to the candidate best on a, c, d: "overfit", which is worst on b.
    assert res["groups"]["b"]["chosen"] == "overfit"
    assert res["heldout"]["b"] == 0.70
    # Each group's choice is what best() makes on the other folds, whatever the held-out
    # scores are: replacing them changes the held-out score, never the choice.
    rng = random.Random(0)
    for g in FOLDS:
        shuffled = {c: {**v, g: rng.random()} for c, v in TABLE.items()}
        again = cv.cross_validate(shuffled, list(TABLE), groups)
        assert again["groups"][g]["chosen"] == res["groups"][g]["chosen"]
        assert again["heldout"][g] == shuffled[again["groups"][g]["chosen"]][g]


def test_held_out_scores_cover_every_fold_once_and_stay_below_the_oracle(cv):
    rng = random.Random(1)
    cands = [f"c{i}" for i in range(5)]
    folds = [f"f{i}" for i in range(6)]
    for _ in range(50):
        table = {c: {f: rng.random() for f in folds} for c in cands}
        for groups in ({f: f for f in folds}, {f: f"g{i % 3}" for i, f in enumerate(folds)}):
            res = cv.cross_validate(table, cands, groups)
            assert sorted(res["heldout"]) == sorted(folds)
            assert sum(res["chosen_count"].values()) == len(set(groups.values()))
            oracle = sum(max(table[c][f] for c in cands) for f in folds) / len(folds)
            assert res["heldout_mean"] <= oracle + 1e-12
            assert res["heldout_min"] <= res["heldout_mean"]
            for g, v in res["groups"].items():
                train = [f for f, h in groups.items() if h != g]
                assert v["chosen"] == cv.best(table, cands, train)


def test_mean_ranks_are_a_permutation_on_average(cv):
    ranks = cv.mean_ranks(TABLE, list(TABLE), FOLDS)
    assert sum(ranks.values()) == pytest.approx(len(TABLE) * (len(TABLE) + 1) / 2)
    assert ranks["weak"] == 3.0
    assert ranks["overfit"] == pytest.approx((1 + 2 + 1 + 1) / 4)
    tied = cv.mean_ranks({"x": {"a": 0.5}, "y": {"a": 0.5}, "z": {"a": None}}, "xyz", ["a"])
    assert tied == {"x": 1.5, "y": 1.5, "z": 3.0}


@pytest.mark.parametrize(
    ("record", "bound", "flagged"),
    [
        ({"E_avail": 0.90, "E_used": 0.95, "util": 0.95, "ceiling": 1.0}, 0.95, False),
        ({"E_avail": 0.95 * (1 + 1e-7), "E_used": 0.95, "util": 1.0, "ceiling": 1.0}, 0.95, False),
        ({"E_avail": 0.96, "E_used": 0.96, "util": 1.0, "ceiling": 1.0}, 0.95, True),
        ({"E_avail": 0.90, "E_used": 1.01, "util": 0.9, "ceiling": 1.0}, 0.95, True),
        ({"E_avail": 0.90, "E_used": 0.90, "util": 1.01, "ceiling": 1.0}, 0.95, True),
        ({"E_avail": 0.5, "E_used": 0.5, "bound_violation": "bug", "ceiling": 1.0}, 0.95, True),
    ],
)
def test_impossible_figures_are_flagged_and_not_scored(cv, record, bound, flagged):
    problems = cv.impossible(record, bound)
    assert bool(problems) == flagged
    if flagged:
        assert cv.score(record, bound) is None
    else:
        assert cv.score(record, bound) == pytest.approx(record["E_avail"] / bound)
        assert cv.score(record, bound) <= 1 + cv.TOL


def test_the_grid_holds_the_current_default_and_folds_are_distinct(cv):
    from parsl_bf.allocation.policy import AllocatorSettings

    default = AllocatorSettings()
    names = {cv.candidate_name(o, t) for o, t in itertools.product(cv.OBJECTIVES, cv.TFWD_RULES)}
    assert cv.candidate_name(default.objective.value, default.tfwd) in names
    for quick in (True, False):
        folds = cv.make_folds(quick)
        assert len({f.name for f in folds}) == len(folds)
        assert sum(f.reference for f in folds) == 1
        assert {f.family for f in folds} == {"hps", "imgps", "spdup"}
