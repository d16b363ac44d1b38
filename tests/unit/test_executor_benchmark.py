"""benchmarks/executor.py's guard on its own figures, on made-up rows."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "executor.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("executor_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def row(e_avail: float, rate1: float | None, e_used: float | None = None) -> dict:
    return {"E_used": e_used or e_avail, "E_avail": e_avail, "E_avail_run": None, "rate1": rate1}


def test_plausible_figures_are_not_noisy(bench):
    rows = {"aware": row(0.80, 1050.0), "replay": row(0.85, 1000.0), "cold": row(0.5, None)}
    assert bench.noise(rows, 1000.0) == []


def test_an_efficiency_above_one_marks_the_run(bench):
    reasons = bench.noise({"aware": row(1.11, 1000.0), "paper": row(1.015, 1000.0)}, 1000.0)
    assert len(reasons) == 2 and all(r.startswith("aware E_") for r in reasons)  # E_used, E_avail


def test_a_run_p1_far_from_the_calibration_marks_the_run(bench):
    reasons = bench.noise({"aware": row(0.7, 880.0), "paper": row(0.7, 1120.0)}, 1000.0)
    assert [r.split()[0] for r in reasons] == ["aware", "paper"]
    assert "-12%" in reasons[0] and "+12%" in reasons[1]
    assert bench.noise({"aware": row(0.7, 905.0)}, 1000.0) == []  # 9.5 % off: within


def test_replay_plus_is_charged_what_the_runs_paid(bench):
    from parsl_bf.executor.analysis import RunFigures

    cal = SimpleNamespace(rescale=5.0)
    aware = RunFigures(fresh_startup_s=[2.0, 4.0], handover_s=[1.0])
    paper = RunFigures(fresh_startup_s=[3.0], handover_s=[0.5, 0.9])
    costs = bench.measured_costs([aware, paper], cal)
    assert (costs.start, costs.rescale) == (3.0, 0.9)
    assert costs.source == "start runs, 3; rescale runs, 3"
    # No warm hand-over in the runs: the calibration's rescale stands in, and says so.
    costs = bench.measured_costs([RunFigures(fresh_startup_s=[2.0])], cal)
    assert (costs.start, costs.rescale) == (2.0, 5.0)
    assert costs.source == "start runs, 1; rescale calibration"
