"""Every Slurm command the backfill provider runs, and the parsing of their output.

Hole discovery: a *hole* is a node of the partition that is idle now (``idle``, or ``planned``:
idle but reserved by the backfill scheduler for a pending job) and how long it stays free:
until the earliest planned start (``squeue --start``) of a pending job whose scheduled nodes
include it; None when no pending job is planned there. ``sbatch --test-only`` is never used: it
ignores those reservations and answers "now".
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

__all__ = ["Hole", "SlurmCommandError", "parse_sinfo_nodes", "parse_squeue_start", "holes"]

Runner = Callable[[Sequence[str]], str]


class SlurmCommandError(RuntimeError):
    """A Slurm command failed; the message has the command and its stderr."""


@dataclass(frozen=True)
class Hole:
    node: str
    state: str
    window_s: float | None  # None: no pending job is planned on this node
    blocking_job: str | None = None


def run(args: Sequence[str], timeout: float = 30.0) -> str:
    """Run a Slurm command; its stdout, or :class:`SlurmCommandError`."""
    try:
        proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmCommandError(f"{' '.join(args)}: {exc}") from None
    if proc.returncode != 0:
        raise SlurmCommandError(f"{' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def parse_sinfo_nodes(text: str) -> dict[str, str]:
    """``sinfo -h -N -o '%N|%T'`` → node → state (a node in two partitions appears once)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if "|" in line:
            node, state = line.strip().split("|", 1)
            out.setdefault(node, state)
    return out


def _epoch(text: str) -> float | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None  # N/A, Unknown


def parse_squeue_start(
    text: str, expand: Callable[[str], list[str]]
) -> dict[str, tuple[float, str]]:
    """``squeue -h -t PD --start -o '%i|%P|%S|%Y'`` → node → (earliest planned start, job)."""
    planned: dict[str, tuple[float, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4:
            continue
        job, _partition, start, scheduled = parts
        when = _epoch(start)
        if when is None or scheduled in ("", "(null)", "N/A"):
            continue
        for node in expand(scheduled):
            if node not in planned or when < planned[node][0]:
                planned[node] = (when, job)
    return planned


def hostnames(hostlist: str, runner: Runner = run) -> list[str]:
    """``n[1-3]`` → ``["n1", "n2", "n3"]`` (scontrol show hostnames)."""
    return runner(["scontrol", "show", "hostnames", hostlist]).split()


def holes(partition: str, now: float, runner: Runner = run) -> list[Hole]:
    """The partition's idle nodes and how long each stays free, longest first."""
    states = parse_sinfo_nodes(runner(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%T"]))
    planned = parse_squeue_start(
        runner(["squeue", "-h", "-t", "PD", "--start", "-o", "%i|%P|%S|%Y"]),
        lambda hostlist: hostnames(hostlist, runner),
    )
    found = []
    for node, state in states.items():
        if not (state.startswith("idle") or state == "planned"):
            continue
        when, job = planned.get(node, (None, None))
        found.append(Hole(node, state, None if when is None else max(0.0, when - now), job))
    return sorted(found, key=lambda h: (h.window_s is not None, -(h.window_s or 0), h.node))
