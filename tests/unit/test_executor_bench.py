"""benchmarks/executor.py's guard of its own figures (a pure function, no run)."""

from __future__ import annotations

from ..benchmarks import benchmark


def test_an_efficiency_past_the_curve_or_below_0_is_left_out_and_listed() -> None:
    with benchmark("executor") as bench:
        rows = {
            "aware": {"E_used": 0.9, "E_avail": 1.3},  # above the sublinear curve's 1
            "cold": {"E_used": -0.2},  # a real run cannot train less than nothing
            "replay+": {"E_used": -0.1, "E_avail": 0.4},  # charges beyond its training
        }
        impossible, undefined = bench._impossible(rows, {1: 10.0, 2: 15.0})
    names = [(x["run"], x["figure"]) for x in impossible]
    assert names == [("aware", "E_avail"), ("cold", "E_used")]
    assert [(x["run"], x["figure"]) for x in undefined] == [("replay+", "E_used")]
    assert rows == {
        "aware": {"E_used": 0.9, "E_avail": None},
        "cold": {"E_used": None},
        "replay+": {"E_used": None, "E_avail": 0.4},
    }
