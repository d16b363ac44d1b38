#!/usr/bin/env python3
"""Every benchmark in ``benchmarks/`` in its ``--quick`` mode: the same code paths, small.

What it checks is that each still runs, never how fast: exit status 0, a last line of stdout
that is one JSON object, and none of the flags a benchmark raises about its own figures
(:data:`FLAGS`: figures that cannot be true or that it cannot believe). A benchmark that needs
what this machine lacks (a loopback Slurm cluster needs root and the Slurm packages) exits 2
with the reason; that is reported as skipped, and fails the run only with ``--strict``.

The flags judge measurements, and a measurement depends on the machine's other load: a P(1)
measured while another process takes a core is not the run's. So the other processes' CPU
is measured while each benchmark runs (``benchmarks/_load.py``); a benchmark that flagged its
figures while others used half a core or more is reported ``loaded`` with that load and its
flags, and fails the run only with ``--strict``. A crash, a missing JSON line or a run past
the bound fails whatever the load.

Usage: ``scripts/bench-quick.py [--python PY] [--only a,b] [--strict]``; ``make bench-quick``.
Prints one line per benchmark as it ends, a table, and one JSON line. Exit 0 only if every
benchmark that ran passed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from _load import LOADED_CORES, Load  # noqa: E402

#: In the environment of every process a benchmark starts: its own CPU is not other load.
MARK = "PARSL_BF_BENCH_QUICK"

#: The JSON keys under which a benchmark lists what is wrong with its own figures.
FLAGS = ("anomalies", "impossible", "suspect")

#: Hard wall-clock bound of one ``--quick`` run; each is meant to take at most 90 s here, the
#: margin is for a machine whose cores another process also keeps busy.
TIMEOUT_S = 400.0


def last_json(stdout: str) -> dict | None:
    """The benchmark's result: its last non-empty stdout line, if that is a JSON object."""
    lines = [x for x in stdout.splitlines() if x.strip()]
    if not lines:
        return None
    try:
        out = json.loads(lines[-1])
    except ValueError:
        return None
    return out if isinstance(out, dict) else None


def flagged(figures: dict) -> list[str]:
    """Every flag in ``figures`` (at any depth), as ``key: item`` lines."""
    found: list[str] = []

    def walk(x: object, where: str) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k in FLAGS and v:
                    items = v if isinstance(v, list) else [v]
                    found.extend(f"{where}{k}: {i}" for i in items)
                else:
                    walk(v, f"{where}{k}.")
        elif isinstance(x, list):
            for v in x:
                walk(v, where)

    walk(figures, "")
    return found


def check(rc: int | None, stdout: str, stderr: str, others: float = 0.0) -> tuple[str, str]:
    """(status, why) of one run: ``ok``, ``skipped`` (exit 2: this machine lacks what it
    needs), ``loaded`` (it flagged its figures while other processes used ``others`` ≥
    :data:`LOADED_CORES` cores) or ``failed``."""
    tail = next((x for x in reversed(stderr.splitlines()) if x.strip()), "")
    if rc is None:
        return "failed", f"no result in {TIMEOUT_S:.0f} s"
    if rc == 2:
        return "skipped", tail or "exit 2"
    if rc != 0:
        return "failed", f"exit {rc}: {tail}"
    figures = last_json(stdout)
    if figures is None:
        return "failed", "its last line is not one JSON object"
    if flags := flagged(figures):
        if others >= LOADED_CORES:
            return "loaded", f"other processes used {others:.2f} cores: " + "; ".join(flags)
        return "failed", "; ".join(flags)
    return "ok", ""


def run_one(py: str, path: Path, log_dir: Path) -> dict:
    argv = [py, str(path), "--quick"]
    began = time.monotonic()
    run_id = uuid.uuid4().hex
    env = {**os.environ, "PYTHONUNBUFFERED": "1", MARK: run_id}
    load = Load(f"{MARK}={run_id}")
    # Its own process group: a run past the bound is ended with every process it started.
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        rc = None
    with contextlib.suppress(ProcessLookupError):  # what it left (a rank mpiexec did not reap)
        os.killpg(proc.pid, signal.SIGKILL)
    wall, others = time.monotonic() - began, load.others()
    (log_dir / f"{path.stem}.out").write_text(stdout)
    (log_dir / f"{path.stem}.err").write_text(stderr)
    status, why = check(rc, stdout, stderr, others)
    return {
        "benchmark": path.stem,
        "status": status,
        "wall_s": round(wall, 1),
        "other_cores": round(others, 2),
        "why": why,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter (default: this one)")
    ap.add_argument("--only", help="comma-separated benchmark names (default: every one)")
    ap.add_argument("--strict", action="store_true", help="a skipped benchmark fails the run")
    ap.add_argument(
        "--logs", type=Path, default=ROOT / "runs" / "bench-quick", help="stdout/stderr per run"
    )
    args = ap.parse_args()
    every = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
    if args.only:
        names = {n.strip() for n in args.only.split(",") if n.strip()}
        unknown = names - {p.stem for p in every}
        if unknown:
            print(f"error: --only: no benchmark {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        every = [p for p in every if p.stem in names]
    args.logs.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, path in enumerate(every, 1):
        print(f"[{i}/{len(every)}] {path.stem} --quick ...", flush=True)
        row = run_one(args.python, path, args.logs)
        rows.append(row)
        print(f"    {row['status']} in {row['wall_s']} s {row['why']}".rstrip(), flush=True)
    print(f"\n{'benchmark':<15} {'status':<8} {'wall s':>7} {'others':>6}  why (logs: {args.logs})")
    for r in rows:
        print(
            f"{r['benchmark']:<15} {r['status']:<8} {r['wall_s']:>7.1f} "
            f"{r['other_cores']:>6.2f}  {r['why']}"
        )
    print("others: cores other processes used meanwhile")
    bad = [r for r in rows if r["status"] == "failed" or (args.strict and r["status"] != "ok")]
    print(
        json.dumps(
            {
                "benchmarks": {r["benchmark"]: r["status"] for r in rows},
                "wall_s": {r["benchmark"]: r["wall_s"] for r in rows},
                "other_cores": {r["benchmark"]: r["other_cores"] for r in rows},
                "failed": [r["benchmark"] for r in bad],
            }
        )
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
