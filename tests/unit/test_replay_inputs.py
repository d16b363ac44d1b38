"""Bad trace, job-set and SWF input: errors that name the file, the line and the field."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from parsl_bf.inputs.errors import ReplayInputError
from parsl_bf.inputs.trace import load_trace
from parsl_bf.replay import load_job_set
from parsl_bf.replay.swf import load_swf

DATA = Path(__file__).resolve().parents[1] / "data"


def _trace_with(tmp_path: Path, lines: list[str]) -> Path:
    d = tmp_path / "trace"
    shutil.copytree(DATA / "trace64", d)
    with gzip.open(d / "events.csv.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    return d


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (["t_s,node", "0,c05n06"], "events.csv.gz:1: missing column(s) state"),
        (["t_s,node,state", "0,c05n06,idle", "5,zz99,busy"], "events.csv.gz:3 node: unknown node"),
        (["t_s,node,state", "9,c05n06,idle", "5,c05n06,busy"], "events.csv.gz:3 t_s: time goes"),
        (["t_s,node,state", "0,c05n06,asleep"], "events.csv.gz:2 state: 'asleep'"),
        (["t_s,node,state", "x,c05n06,idle"], "events.csv.gz:2 t_s: not an integer"),
    ],
)
def test_bad_trace(tmp_path: Path, lines: list[str], expected: str) -> None:
    with pytest.raises(ReplayInputError) as info:
        load_trace(_trace_with(tmp_path, lines))
    assert expected in str(info.value)


def test_bad_job_sets(tmp_path: Path) -> None:
    rows = (DATA / "hps-shufflenet-10J.csv").read_text().splitlines()
    bad = rows[:3] + [
        rows[3].replace('"[0, 1, 2, 4, 8, 16, 32, 64]"', '"[0, 1, 4, 2, 8, 16, 32, 64]"')
    ]
    (tmp_path / "j.csv").write_text("\n".join(bad) + "\n")
    with pytest.raises(ReplayInputError, match=r"j.csv:4 nodes: node counts must be strictly"):
        load_job_set(tmp_path / "j.csv")
    data = json.loads((DATA / "hps-shufflenet-10J.json").read_text())
    del data["jobs"][2]["jmax"]
    (tmp_path / "j.json").write_text(json.dumps(data))
    with pytest.raises(ReplayInputError, match=r"j.json:1 jobs\[2\].jmax: missing"):
        load_job_set(tmp_path / "j.json")
    data["jobs"][2]["jmax"] = 128  # beyond the curve's last breakpoint
    (tmp_path / "j.json").write_text(json.dumps(data))
    with pytest.raises(ReplayInputError, match=r"jobs\[2\].jmax: 128 lies beyond"):
        load_job_set(tmp_path / "j.json")


SWF = """\
; MaxNodes: 4
; a comment
1 0 0 100 2 -1 -1 2 100 -1 1 1 1 1 1 -1 -1 -1
2 10 5 50 1 -1 -1 1 50 -1 1 1 1 1 1 -1 -1 -1
3 20 -1 50 1 -1 -1 1 50 -1 1 1 1 1 1 -1 -1 -1
4 30 70 40 3 -1 -1 3 40 -1 1 1 1 1 1 -1 -1 -1
"""


def test_swf_jobs_become_node_idle_intervals(tmp_path: Path) -> None:
    (tmp_path / "log.swf").write_text(SWF)
    trace, stats = load_swf(tmp_path / "log.swf")
    assert (stats.jobs, stats.skipped, stats.squeezed) == (3, 1, 0)
    times, counts = trace.idle_counts()
    # job 1 holds 2 nodes on [0,100), job 2 one on [15,65), job 4 three on [100,140).
    assert times.tolist() == [0, 15, 65, 100, 140]
    assert counts.tolist() == [2, 1, 2, 1, 4]
    assert trace.end_s == 140 and len(trace.nodes) == 4


def test_swf_without_machine_size_says_so(tmp_path: Path) -> None:
    (tmp_path / "log.swf").write_text("\n".join(SWF.splitlines()[2:]) + "\n")
    with pytest.raises(ReplayInputError, match="MaxNodes"):
        load_swf(tmp_path / "log.swf")
    trace, _ = load_swf(tmp_path / "log.swf", n_nodes=8)
    assert len(trace.nodes) == 8
