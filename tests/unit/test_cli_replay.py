"""`parsl-bf replay` end to end on a real trace excerpt (64 nodes, one week)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
PARSL_BF = str(Path(sys.executable).with_name("parsl-bf"))


def _replay(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            PARSL_BF,
            "replay",
            "--trace",
            str(DATA / "trace64"),
            "--jobs",
            str(DATA / "hps-shufflenet-10J.json"),
            "--out",
            str(tmp_path / "out"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_milp_replay_to_completion_beats_equal_share(tmp_path: Path) -> None:
    milp = _replay(tmp_path, "--policy", "milp", "--tfwd", "auto")
    assert milp.returncode == 0, milp.stderr
    summary = json.loads(milp.stdout.strip().splitlines()[-1])
    assert summary["jobs_done"] == 10 and summary["samples"] == pytest.approx(1.3e9)
    assert summary["solve_status"] == {"optimal": summary["solves"]}  # no time-outs
    assert 0 < summary["E_used"] <= 1 and 0 < summary["util"] <= 1
    assert summary["E_avail"] == pytest.approx(summary["E_used"] * summary["util"])
    assert "median hole length" in milp.stderr  # T_fwd chosen from the trace
    out = tmp_path / "out"
    assert json.loads((out / "summary.json").read_text())["E_avail"] == summary["E_avail"]
    with (out / "steps.csv").open() as f:
        steps = list(csv.DictReader(f))
    assert len(steps) == summary["events"]
    assert all(int(r["alloc_nodes"]) <= int(r["idle_nodes"]) for r in steps)
    for png in ("nodes.png", "tasks.png", "samples.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"

    share = _replay(tmp_path, "--policy", "equal-share")
    assert share.returncode == 0, share.stderr
    baseline = json.loads(share.stdout.strip().splitlines()[-1])
    assert summary["E_avail"] > baseline["E_avail"]


def test_window_and_errors(tmp_path: Path) -> None:
    ok = _replay(tmp_path, "--policy", "greedy", "--start", "1h", "--end", "3h", "--tfwd", "60")
    assert ok.returncode == 0, ok.stderr
    summary = json.loads(ok.stdout.strip().splitlines()[-1])
    assert summary["replayed_s"] == 2 * 3600 and summary["start_s"] == 3600
    assert summary["accounting"] == "executor"
    original = _replay(tmp_path, "--policy", "greedy", "--end", "1h", "--original-accounting")
    assert original.returncode == 0, original.stderr
    assert json.loads(original.stdout.strip().splitlines()[-1])["accounting"] == "original"
    empty = _replay(tmp_path, "--start", "10d")
    assert empty.returncode == 2 and "empty window" in empty.stderr
    (tmp_path / "bad.csv").write_text("job,model\nx,y\n")
    bad = subprocess.run(
        [PARSL_BF, "replay", "--trace", str(DATA / "trace64"), "--jobs", str(tmp_path / "bad.csv")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "bad.csv:2 submit_window_s: missing" in bad.stderr


def test_the_bound_stage_is_announced_and_can_be_left_out(tmp_path: Path) -> None:
    ok = _replay(tmp_path, "--policy", "greedy", "--end", "2h", "--tfwd", "60")
    assert ok.returncode == 0, ok.stderr
    summary = json.loads(ok.stdout.strip().splitlines()[-1])
    assert summary["E_avail_bound"] is not None and summary["bound"]["lp_solves"] >= 1
    lines = ok.stderr.splitlines()
    # Announced once, after the events' progress, before the LPs' time is spent in silence.
    (stage,) = [i for i, line in enumerate(lines) if "E_avail bound: solving" in line]
    assert "--no-bound" in lines[stage]
    assert all(i < stage for i, line in enumerate(lines) if "% (" in line)
    (row,) = [line for line in ok.stdout.splitlines() if line.startswith("bound LPs / s")]
    assert row.split()[4] == str(summary["bound"]["lp_solves"])
    left_out = _replay(tmp_path, "--policy", "greedy", "--end", "2h", "--tfwd", "60", "--no-bound")
    assert left_out.returncode == 0, left_out.stderr
    summary = json.loads(left_out.stdout.strip().splitlines()[-1])
    assert summary["E_avail_bound"] is None and "bound" not in summary
    assert "E_avail bound: solving" not in left_out.stderr


@pytest.mark.slow
def test_balanced_meets_the_reference_target(tmp_path: Path) -> None:
    # The reference setting (original: E_used 0.924, E_avail 0.824): T_fwd chosen from the
    # trace, no solve at the time limit, E_avail >= 0.87 with E_used >= 0.92.
    done = _replay(tmp_path, "--policy", "milp", "--objective", "balanced")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["jobs_done"] == 10
    assert summary["solve_status"] == {"optimal": summary["solves"]}
    assert summary["E_avail"] >= 0.87 and summary["E_used"] >= 0.92
