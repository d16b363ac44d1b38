"""Job-set and idle-trace readers on the bftrainer-dev formats."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from parsl_bf.inputs.trace import load_trace
from parsl_bf.replay import load_job_set

DATA = Path(__file__).resolve().parents[1] / "data"


def test_json_and_csv_job_sets_agree() -> None:
    from_json = load_job_set(DATA / "hps-shufflenet-10J.json")
    from_csv = load_job_set(DATA / "hps-shufflenet-10J.csv")
    assert from_json == from_csv
    assert len(from_json) == 10
    first = from_json[0]
    assert (first.id, first.min_nodes, first.max_nodes, first.submit_s) == ("J00000", 1, 64, 0.0)
    assert first.nodes == (0, 1, 2, 4, 8, 16, 32, 64) and first.throughput[-1] == 145081.5
    assert [j.submit_s for j in from_json] == sorted(j.submit_s for j in from_json)
    spec = first.task(current_nodes=4, remaining_work=1e6)
    assert spec.value is None and spec.current_nodes == 4  # objective curve == throughput here


def _write_trace(path: Path) -> None:
    path.mkdir()
    (path / "nodes.csv").write_text(
        "node,col_index,n_idle_intervals,idle_hours,idle_fraction\n"
        "b,1,1,0,0\na,0,1,0,0\nc,2,1,0,0\n"
    )
    rows = [
        "t_s,node,state",
        "0,a,idle",
        "0,b,busy",
        "0,c,idle",
        "10,b,idle",
        "10,c,busy",
        "25,a,busy",
        "40,c,idle",
    ]
    with gzip.open(path / "events.csv.gz", "wt") as f:
        f.write("\n".join(rows) + "\n")
    (path / "meta.json").write_text(json.dumps({"end_s": 60}))


def test_trace_steps_and_node_subsets(tmp_path: Path) -> None:
    _write_trace(tmp_path / "trace")
    trace = load_trace(tmp_path / "trace")
    assert trace.nodes == ("a", "b", "c")  # by col_index
    steps = [(t, mask.tolist()) for t, mask in trace.steps()]
    assert steps == [
        (0, [True, False, True]),
        (10, [True, True, False]),
        (25, [False, True, False]),
        (40, [False, True, True]),
    ]
    times, counts = trace.idle_counts()
    assert times.tolist() == [0, 10, 25, 40] and counts.tolist() == [2, 2, 1, 2]
    sub = load_trace(tmp_path / "trace", n_nodes=1, node_offset=1)
    assert sub.nodes == ("b",) and sub.end_s == 60
    assert np.array_equal(sub.idle_counts()[1], [0, 1])
