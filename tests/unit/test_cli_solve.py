"""`parsl-bf solve`, run as the installed command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARSL_BF = str(Path(sys.executable).with_name("parsl-bf"))


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PARSL_BF, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("solver", ["milp", "exact"])
def test_solve_prints_a_json_plan(solver: str) -> None:
    proc = _run("solve", str(ROOT / "examples" / "instance.json"), "--solver", solver)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"status", "objective", "counts", "solve_s"}
    assert out["status"] == "optimal"
    assert set(out["counts"]) == {"shufflenet-a", "alexnet-b", "resnet-c"}
    assert sum(out["counts"].values()) <= 6 + 2 + 4


def test_both_solvers_agree() -> None:
    plans = [
        json.loads(_run("solve", str(ROOT / "examples" / "instance.json"), "--solver", s).stdout)
        for s in ("milp", "exact")
    ]
    assert plans[0]["objective"] == pytest.approx(plans[1]["objective"])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"objective": "fastest"}, "objective"),
        ({"tasks": []}, "tasks"),
        ({"task0": {"min_nodes": 9}}, "tasks[0].min_nodes"),
        ({"task0": {"nodes": [1, 2, 4, 8], "throughput": [0, 1, 2, 3]}}, "tasks[0].nodes"),
        ({"task0": {"rescale_down_s": -3}}, "tasks[0].rescale_down_s"),
    ],
)
def test_bad_instance_exits_2_with_one_line(tmp_path: Path, change: dict, field: str) -> None:
    data = json.loads((ROOT / "examples" / "instance.json").read_text())
    data["tasks"][0].update(change.pop("task0", {}))
    data.update(change)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    proc = _run("solve", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f" {field}: " in lines[0], proc.stderr


def test_unreadable_instance_exits_2(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("{not json")
    for path in (tmp_path / "x.json", tmp_path / "missing.json"):
        proc = _run("solve", str(path))
        assert proc.returncode == 2 and str(path) in proc.stderr
