"""scripts/bench-quick.py's verdict on a benchmark's run, on small real scripts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
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


FLAGGED = [
    ({"anomalies": ["more received than sent"]}, "more received"),
    ({"per_fold": {"a": {"impossible": ["util 1.2"]}}}, "util 1.2"),
    ({"suspect": "w1 vs plain 1.7"}, "w1 vs plain"),
]


@pytest.mark.parametrize(("figures", "why"), FLAGGED)
def test_a_flag_fails_on_a_quiet_machine(runner, figures, why) -> None:
    status, reason = runner.check(0, json.dumps(figures), "", others=0.0)
    assert status == "failed" and why in reason


@pytest.mark.parametrize(("figures", "why"), FLAGGED)
def test_a_flag_raised_while_others_used_the_cores_is_loaded(runner, figures, why) -> None:
    status, reason = runner.check(0, json.dumps(figures), "", others=1.6)
    assert status == "loaded" and why in reason and "1.60 cores" in reason


def test_a_crash_fails_whatever_the_load(runner) -> None:
    assert runner.check(1, "", "rank died", others=1.6) == ("failed", "exit 1: rank died")
    assert runner.check(None, "", "", others=1.6)[0] == "failed"  # past the bound
    assert runner.check(0, "table", "", others=1.6)[0] == "failed"  # no JSON line


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("print(json.dumps({'x': 1}))\nprint('done')", "not one JSON object"),
        ("print('[1, 2]')", "not one JSON object"),
        ("print(json.dumps({'x': 1}))\nsys.exit('child rank died')", "child rank died"),
    ],
)
def test_a_missing_line_or_a_failure_fails(runner, tmp_path: Path, body, why) -> None:
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


def test_load_tells_the_runs_processes_from_others(runner) -> None:
    """A process carrying the run's marker is the run's own (its CPU is followed by pid); one
    without it that keeps a core busy is other load."""
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass\n"
    marker = "PARSL_BF_TEST_LOAD=1"
    load = runner.Load(marker)
    own = subprocess.Popen([sys.executable, "-c", spin + "import time; time.sleep(30)"],
                           env={"PARSL_BF_TEST_LOAD": "1"})  # fmt: skip
    other = subprocess.run([sys.executable, "-c", spin], env={})
    try:
        assert other.returncode == 0
        # Its second of CPU over at most a few seconds of wall (however busy the machine):
        assert load.others() >= 0.25
        load._scan()  # the run's own process, seen by its marker
        assert own.pid in load.cpu
    finally:
        own.kill()
        own.wait()
