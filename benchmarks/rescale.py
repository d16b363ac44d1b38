"""Rescale cost of a ResNet-18 fragment on CPU: from the decision to the first step at the new
size, for a shrink 4 → 2 and a grow 2 → 4 (median of 5 each).

At the decision the old ranks get SIGUSR1: they finish their step, rank 0 writes the checkpoint
and the result file, they exit. The new size runs with ``--after`` that result file: it imports
torch and builds the model and optimizer, waits for the file, loads the checkpoint and steps.
Two modes: ``standby`` (default) starts the new size before the decision and waits until it
reports ``--ready``, as a pilot's warm workers on their nodes would be; ``cold`` starts it at
the decision, so process start-up (imports: ~2.4 CPU-s per rank here) is inside the interval.
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from parsl_bf.training.command import mpiexec_argv, worker_argv  # noqa: E402
from tests.integration.fragments import rank_pids  # noqa: E402

TASK = "parsl_bf.training.examples:resnet18_synthetic"


def launch(world: int, tmp: Path, run: int) -> subprocess.Popen:
    """Run ``run`` of the fragment; from run 1 on it takes over from run - 1 (``--after``)."""
    args = mpiexec_argv(world) + worker_argv(
        TASK,
        10**9,
        tmp / "ckpt",
        {"samples": 128, "image": 64},
        checkpoint_every=1000,
        report=tmp / "report.jsonl",
        result=tmp / f"result-{run}.json",
    )
    if run > 0:
        args += [
            "--after",
            str(tmp / f"result-{run - 1}.json"),
            "--ready",
            str(tmp / f"ready-{run}"),
        ]
    log = (tmp / f"run-{run}.log").open("w")  # a file, not a pipe that nobody drains
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def reports(tmp: Path) -> list[dict]:
    path = tmp / "report.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def starts(tmp: Path) -> list[dict]:
    return [r for r in reports(tmp) if r["event"] == "start"]


def wait_until(pred, timeout: float = 300, tmp: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("fragment did not report in time")
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--mode",
        choices=["standby", "cold"],
        default="standby",
        help="standby: the new size is started and set up before the decision, as a "
        "pilot's warm workers are; cold: it is started at the decision",
    )
    args = ap.parse_args()
    timings: dict[str, list[float]] = {"shrink": [], "grow": []}
    with tempfile.TemporaryDirectory(prefix="rescale-") as d:
        tmp = Path(d)
        world = 4
        proc = launch(world, tmp, 0)
        print(f"{'mode':>8} {'rescale':>8} {'from':>4} {'to':>3} {'seconds':>8}")
        for run in range(2 * args.repeats):
            # The current run must be training (its first step done) before the decision.
            wait_until(lambda run=run: len(starts(tmp)) > run)
            pids = rank_pids(proc, world)
            new = 2 if world == 4 else 4
            if args.mode == "standby":  # the next size waits, set up, before the decision
                following = launch(new, tmp, run + 1)
                try:
                    wait_until(lambda run=run: (tmp / f"ready-{run + 1}").exists())
                except TimeoutError:
                    print((tmp / f"run-{run + 1}.log").read_text(), file=sys.stderr)
                    raise
            decided = time.time()
            if args.mode == "cold":
                following = launch(new, tmp, run + 1)
            for pid in pids:
                os.kill(pid, signal.SIGUSR1)
            if proc.wait(timeout=300) != 0:
                print((tmp / f"run-{run}.log").read_text(), file=sys.stderr)
                return 1
            proc = following
            wait_until(lambda run=run: len(starts(tmp)) > run + 1)
            seconds = starts(tmp)[-1]["first_step_at"] - decided
            kind = "shrink" if new < world else "grow"
            timings[kind].append(seconds)
            print(f"{args.mode:>8} {kind:>8} {world:>4} {new:>3} {seconds:>8.2f}")
            world = new
        for pid in rank_pids(proc, world):
            os.kill(pid, signal.SIGTERM)
        proc.wait(timeout=300)
    figures = {f"{k}_s": round(statistics.median(v), 2) for k, v in timings.items()}
    figures["mode"] = args.mode
    print(
        f"median ({args.mode}): shrink {figures['shrink_s']} s, grow {figures['grow_s']} s "
        "(the paper's Elastic Horovod: 11-19 s)"
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
