"""`parsl-bf run` with the example workflows on a stock HTEX over the local backfill emulation,
and `parsl-bf status`, run as the installed command."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .htex import ROOT

PARSL_BF = str(Path(sys.executable).with_name("parsl-bf"))

# Two emulated nodes that stay idle for the whole test (synthetic trace, 10^6 trace seconds
# idle): one pilot, two workers.
CONFIG = """\
executors:
  - type: HighThroughputExecutor
    label: bf
    max_workers_per_node: 2
    heartbeat_period: 2
    heartbeat_threshold: 20
    provider:
      type: LocalBackfillProvider
      nodes: 2
      trace: null
      idle_s: 1000000
      busy_s: 60
      min_walltime: "00:00:05"
      max_walltime: "00:30:00"
      init_blocks: 1
      max_blocks: 1
run_dir: {run_dir}
retries: 1
"""


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "local-small.yaml"
    path.write_text(CONFIG.format(run_dir=tmp_path / "runinfo"))
    return path


def _run(tmp_path: Path, *args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    # HTEX starts its interchange and workers from PATH; they unpickle this package's apps.
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [PARSL_BF, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env=env,
    )


def _last_json(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_run_hpo_sweep(tmp_path: Path) -> None:
    out = tmp_path / "hpo"
    proc = _run(
        tmp_path,
        "run",
        str(ROOT / "workflows" / "hpo_sweep.py"),
        "--config",
        str(_config(tmp_path)),
        "--trials",
        "3",
        "--min-work",
        "500",
        "--max-work",
        "1500",
        "--out",
        str(out),
    )
    summary = _last_json(proc)
    assert summary["trials"] == 3
    assert summary["completed"] >= 1
    assert summary["best"]["accuracy"] > 0.3
    assert summary["preemptions"] == 0
    assert summary["rungs"] == [500, 1500]
    assert summary["report"] == str(out)
    assert (out / "leaderboard.csv").read_text().count("\n") == 1 + 3
    report = (out / "report.md").read_text()
    assert "## Tasks (4)" in report  # 3 trials at rung 0, the best one again at rung 1
    # On a stock HTEX a promoted trial trains its rung from the start (on a BackfillExecutor it
    # continues from its checkpoint: test_no_work_lost).
    with (out / "history.csv").open() as f:
        (promoted,) = [row for row in csv.DictReader(f) if row["rung"] == "1"]
    assert promoted["status"] == "done" and int(promoted["trained"]) == 1500
    assert summary["samples"] == 3 * 500 + 1500
    assert (out / "nodes.png").stat().st_size > 0
    assert "[parsl-bf" in proc.stdout  # progress lines (stdout is not a terminal)


@pytest.mark.slow
def test_run_nas_sweep(tmp_path: Path) -> None:
    out = tmp_path / "nas"
    proc = _run(
        tmp_path,
        "run",
        str(ROOT / "workflows" / "nas_sweep.py"),
        "--config",
        str(_config(tmp_path)),
        "--candidates",
        "4",
        "--work",
        "1000",
        "--out",
        str(out),
    )
    summary = _last_json(proc)
    assert summary["candidates"] == 4 and summary["completed"] >= 1
    assert summary["pareto"] and summary["best"]["accuracy"] > 0.3
    assert (out / "pareto.png").stat().st_size > 0
    assert (out / "candidates.csv").read_text().count("\n") == 1 + 4


def test_run_reports_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("executors:\n  - type: HighThroughputExecutor\n    labl: bf\n")
    proc = _run(tmp_path, "run", str(ROOT / "workflows" / "hpo_sweep.py"), "--config", str(bad))
    assert proc.returncode == 2
    assert f"{bad}:3 executors[0].labl: unknown key" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_needs_a_workflow_with_main(tmp_path: Path) -> None:
    script = tmp_path / "nothing.py"
    script.write_text("x = 1\n")
    proc = _run(tmp_path, "run", str(script), "--config", str(_config(tmp_path)))
    assert proc.returncode == 2 and "no main(argv=None, config=None)" in proc.stderr
    proc = _run(tmp_path, "run", str(tmp_path / "gone.py"), "--config", str(_config(tmp_path)))
    assert proc.returncode == 2 and "no such workflow file" in proc.stderr


def test_status_without_a_backfill_executor(tmp_path: Path) -> None:
    proc = _run(tmp_path, "status", str(tmp_path))
    assert proc.returncode == 1
    assert proc.stdout.startswith(f"no executor status found under {tmp_path} ")


def test_status_shows_the_latest_snapshot(tmp_path: Path) -> None:
    snapshot = {
        "label": "bf",
        "pilots": [{"pilot": "p1", "nodes": ["node0", "node1"], "ends_in_s": 300, "leaving": 0}],
        "tasks": [
            {"task": "t7", "state": "running", "nodes": 2, "samples": 4096, "work": 9000,
             "rate": 812.5}
        ],
        "plain": {"queued": 0, "running": 1, "done": 3},
        "solves": 5,
        "last_solve_s": 0.0123,
        "preemptions": 1,
        "updated": 0,
        "decisions": 5,
        "decision_p50_s": 0.02,
    }  # fmt: skip
    for run in ("000", "001"):
        d = tmp_path / run / "bf"
        d.mkdir(parents=True)
        (d / "status.json").write_text(json.dumps(snapshot | {"solves": int(run) + 10}))
    os.utime(tmp_path / "000" / "bf" / "status.json", (1, 1))  # the older run
    proc = _run(tmp_path, "status", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "001/bf/status.json" in proc.stdout and "000/bf" not in proc.stdout
    for text in ("node0,node1", "t7", "4096", "812.5", "0.012 s", "11"):
        assert text in proc.stdout
