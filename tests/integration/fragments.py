"""Helpers to run training fragments with the real mpiexec."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from parsl_bf.training.command import MPIEXEC, worker_argv

ROOT = Path(__file__).resolve().parents[2]
TASK = "parsl_bf.training.examples:digits_cnn"


def worker_args(tmp: Path, work: int, task: str = TASK, options=None, **extra) -> list[str]:
    """A rank's command line, with the report and result files in ``tmp``."""
    if isinstance(options, str):
        options = json.loads(options)
    return worker_argv(
        task,
        work,
        tmp / "ckpt",
        options,
        report=tmp / "report.jsonl",
        result=tmp / "result.json",
        **extra,
    )


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def run(n: int, tmp: Path, work: int, timeout: float = 300, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MPIEXEC, "-n", str(n), *worker_args(tmp, work, **extra)],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start(n: int, tmp: Path, work: int, **extra) -> subprocess.Popen:
    return subprocess.Popen(
        [MPIEXEC, "-n", str(n), *worker_args(tmp, work, **extra)],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def rank(tmp: Path, work: int, **extra) -> subprocess.Popen:
    """One rank, its own ``mpiexec -n 1`` (as the executor's warm ranks are, joined by the
    rendezvous); its standard error readable for the test's messages."""
    return subprocess.Popen(
        [MPIEXEC, "-n", "1", *worker_args(tmp, work, **extra)],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def until(pred, timeout: float = 300) -> None:
    """Until ``pred()``; fails the test after ``timeout`` s (a bound on a wait, not a speed)."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def result(tmp: Path) -> dict:
    return json.loads((tmp / "result.json").read_text())


def rank_pids(launcher: subprocess.Popen, n: int, timeout: float = 60) -> list[int]:
    """PIDs of the fragment's rank processes (the workers under mpiexec's proxy)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            ours = b"parsl_bf.training.worker" in cmd and b"PMI_RANK=" in environ
            if ours and descends(int(proc.name), launcher.pid):
                found.append(int(proc.name))
        if len(found) == n:
            return sorted(found)
        time.sleep(0.2)
    raise TimeoutError(f"{n} ranks of {launcher.pid} not found")


def descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


def wait_for_report(tmp: Path, event: str, min_samples: int = 0, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = tmp / "report.jsonl"
        if path.exists():
            for line in reversed(path.read_text().splitlines()):
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if r["event"] == event and r["samples"] >= min_samples:
                    return r
        time.sleep(0.1)
    raise TimeoutError(f"no {event} report with ≥ {min_samples} samples")
