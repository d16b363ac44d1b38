"""Our replay in the original's accounting against recorded output of the original replayer.

``tests/data/original-replayer`` holds real output of the original (its README says how it was
made); ``benchmarks/original.py`` reads it here as it reads a live run, and our replay of the
same instance is held to the benchmark's fidelity bounds.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from parsl_bf.inputs.trace import load_trace
from parsl_bf.replay import load_job_set

from ..benchmarks import BENCHMARKS, benchmark

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDED = DATA / "original-replayer"
NODES, END_S = 16, 12 * 3600
ARGS = types.SimpleNamespace(tfwd=10.0, time_limit=10.0, max_jobs=10)


@pytest.fixture(scope="module")
def bench():
    with benchmark("original") as module:
        yield module


@pytest.fixture(scope="module")
def instance(bench, tmp_path_factory):
    trace = load_trace(DATA / "trace64", NODES)
    jobs = load_job_set(DATA / "hps-shufflenet-10J.json")
    t0 = json.loads((DATA / "trace64" / "meta.json").read_text())["t0"]
    work = tmp_path_factory.mktemp("instance")
    times = bench.write_instance(trace, jobs, t0, END_S, work)
    return trace, jobs, t0, times


def _recorded(bench, instance, policy: str) -> dict:
    trace, jobs, t0, times = instance
    work = RECORDED / policy
    stdout = (work / "stdout.txt").read_text()
    return bench.original_figures(stdout, work, t0, times, int(trace.initial.sum()), jobs)


def test_the_recorded_run_is_read_whole(bench, instance) -> None:
    # Every job's samples from the progress lines add up to the step log's own total, and the
    # step log's events are the instance's trace rows, in order.
    for policy in ("equal-share", "milp"):
        got = _recorded(bench, instance, policy)
        assert got["samples"] == pytest.approx(got["samples_in_step_log"], rel=1e-9)
        assert got["jobs_admitted"] == 10 and got["end_s"] in instance[3]
        assert 0 < got["util"] <= 1 and 0 < got["E_avail"] <= got["util"]


def test_equal_share_in_the_original_accounting_reproduces_the_original(bench, instance) -> None:
    trace, jobs, _, _ = instance
    theirs = _recorded(bench, instance, "equal-share")
    mine = bench.ours(trace, jobs, "equal-share", theirs["end_s"], ARGS)
    bound = bench.BOUNDS["equal-share"]
    assert mine["E_avail"] == pytest.approx(theirs["E_avail"], abs=bound)
    assert mine["util"] == pytest.approx(theirs["util"], abs=bound)


def test_our_milp_scores_every_cbc_answer_as_cbc_did_and_never_does_worse(bench, instance) -> None:
    # The same objective on both sides: our score of each answer CBC gave equals the objective
    # CBC printed for it, and ours is never below it. Where ours is above (CBC's "optimal"
    # answers are not always optimal on its SOS2 models), the MILP rows differ by the solver.
    theirs = _recorded(bench, instance, "milp")
    check, suspect = bench.solver_check(theirs["solves"], ARGS)
    assert suspect == []
    assert check["solves"] == len(theirs["solves"]) > 0
    assert check["original_better"] == 0
    assert check["ours_better"] + check["same"] == check["solves"]


def test_without_the_original_the_benchmark_says_what_it_needs(tmp_path: Path) -> None:
    import subprocess

    script = BENCHMARKS / "original.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 2 and "--original-src" in done.stderr
    assert "Traceback" not in done.stderr
    empty = subprocess.run(
        [sys.executable, str(script), "--original-src", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert empty.returncode == 2 and "not a checkout of BFTrainer/Replayer" in empty.stderr
    assert "Traceback" not in empty.stderr


def test_our_accounting_given_cbcs_answers_reproduces_the_original_milp(bench, instance) -> None:
    # Fed the original's own CBC answers, event by event, our replay in its accounting lands
    # within the no-solver bound of the original's figures: what is left between the MILP rows
    # is the solver.
    trace, jobs, _, times = instance
    theirs = _recorded(bench, instance, "milp")
    follow, progress, tally = bench.cbc_decisions(theirs["solves"], times, ARGS.time_limit)
    mine = bench.ours(trace, jobs, follow, theirs["end_s"], ARGS, progress)
    assert tally["followed"] == len(theirs["solves"])
    assert mine["E_avail"] == pytest.approx(theirs["E_avail"], abs=bench.BOUNDS["equal-share"])
    assert mine["util"] == pytest.approx(theirs["util"], abs=bench.BOUNDS["equal-share"])
