"""scripts/bench-quick.py's verdict on a benchmark's run, on small real scripts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench-quick.py"


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("bench_quick", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def verdict(runner, tmp_path: Path, body: str) -> dict:
    script = tmp_path / "bench.py"
    script.write_text("import json, sys\nassert sys.argv[1:] == ['--quick']\n" + body)
    return runner.run_one(sys.executable, script, tmp_path)


def test_a_clean_json_line_passes(runner, tmp_path: Path) -> None:
    body = "print('table')\nprint(json.dumps({'x': 1, 'anomalies': [], 'suspect': []}))\n"
    assert verdict(runner, tmp_path, body)["status"] == "ok"
    assert (tmp_path / "bench.out").read_text().startswith("table")


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("print(json.dumps({'anomalies': ['more received than sent']}))", "more received"),
        ("print(json.dumps({'per_fold': {'a': {'impossible': ['util 1.2']}}}))", "util 1.2"),
        ("print(json.dumps({'suspect': 'w1 vs plain 1.7'}))", "w1 vs plain"),
        ("print(json.dumps({'x': 1}))\nprint('done')", "not one JSON object"),
        ("print('[1, 2]')", "not one JSON object"),
        ("print(json.dumps({'x': 1}))\nsys.exit('child rank died')", "child rank died"),
    ],
)
def test_a_flag_a_missing_line_or_a_failure_fails(runner, tmp_path: Path, body, why) -> None:
    got = verdict(runner, tmp_path, body)
    assert got["status"] == "failed" and why in got["why"]


def test_exit_2_is_a_skip_with_its_reason(runner, tmp_path: Path) -> None:
    got = verdict(runner, tmp_path, "sys.stderr.write('error: needs root\\n')\nsys.exit(2)")
    assert got == got | {"status": "skipped", "why": "error: needs root"}


def test_every_benchmark_has_a_quick_mode() -> None:
    # As scripts/bench-quick.py selects them: a leading "_" marks a helper, not a benchmark.
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if path.name.startswith("_"):
            continue
        assert '"--quick"' in path.read_text(), f"{path.name} has no --quick"
