"""Every Slurm command the backfill provider runs, and the parsing of their output.

Hole discovery: a *hole* is a node of the partition that is idle now (``idle``, or ``planned``:
idle but reserved by the backfill scheduler for a pending job) and how long it stays free:
until the earliest planned start (``squeue --start``) of a pending job whose scheduled nodes
include it; None when no pending job is planned there. ``sbatch --test-only`` is never used: it
ignores those reservations and answers "now".
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from datetime import datetime

from ..base import SchedulerError
from ..sizing import Hole

__all__ = [
    "NODE_LIST_SHELL",
    "PREEMPTED_SHELL",
    "Hole",
    "SlurmCommandError",
    "check_partition",
    "end_time_shell",
    "holes",
    "parse_job",
    "parse_sinfo_nodes",
    "parse_squeue_start",
    "sbatch",
    "scancel",
    "show_job",
]

Runner = Callable[[Sequence[str]], str]


class SlurmCommandError(SchedulerError):
    """A Slurm command failed; the message has the command and its stderr."""


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


def epoch(text: str) -> float | None:
    """Seconds since the epoch of a Slurm time stamp (local time); None for N/A, None, Unknown."""
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
        when = epoch(start)
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
        # "idle*" does not respond, "idle~" is powered down: no pilot starts there soon.
        if state not in ("idle", "planned"):
            continue
        when, job = planned.get(node, (None, None))
        found.append(Hole(node, state, None if when is None else max(0.0, when - now), job))
    return sorted(found, key=lambda h: (h.window_s is not None, -(h.window_s or 0), h.node))


def check_partition(partition: str, runner: Runner = run) -> None:
    """Raise :class:`SlurmCommandError` with Slurm's message if ``partition`` does not exist."""
    runner(["scontrol", "show", "partition", partition])


def sbatch(script: str, runner: Runner = run) -> str:
    """Submit a batch script file; the job id."""
    out = runner(["sbatch", "--parsable", script]).strip()
    job_id = out.split(";", 1)[0]
    if not job_id.isdigit():
        raise SlurmCommandError(f"sbatch {script}: unexpected answer {out!r}")
    return job_id


def parse_job(text: str) -> dict[str, str]:
    """One job of ``scontrol show job -o`` → its fields (values without spaces suffice here)."""
    return dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", text))


def show_job(job_id: str, runner: Runner = run) -> dict[str, str] | None:
    """``scontrol show job -o``'s fields of a job; None once the controller forgot it."""
    try:
        text = runner(["scontrol", "show", "job", "-o", job_id])
    except SlurmCommandError as exc:
        if "Invalid job id" in str(exc):
            return None  # older than MinJobAge, and there may be no accounting database
        raise
    return parse_job(text) if text.strip() else None


def scancel(job_ids: Sequence[str], runner: Runner = run) -> None:
    """Cancel jobs (the batch shell and every step get SIGTERM, then SIGKILL)."""
    if job_ids:
        runner(["scancel", *job_ids])


#: Run inside a job: its nodes, comma-separated.
NODE_LIST_SHELL = 'scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -'


def end_time_shell(fallback_s: int) -> str:
    """A shell expression, run inside a job, printing the epoch second its walltime ends:
    ``scontrol show job``'s ``EndTime`` (local time, as Slurm prints it), else
    ``fallback_s`` from now when the controller does not answer."""
    ask = 'scontrol show job -o "$SLURM_JOB_ID" | grep -o "EndTime=[0-9T:-]*" | cut -d= -f2'
    return (
        f'$(end=$({ask}); date -d "${{end:-none}}" +%s 2>/dev/null'
        f" || echo $(( $(date +%s) + {fallback_s} )))"
    )


#: Run inside a job on its --signal: true if it is being preempted (PreemptTime is set), false
#: for the walltime notice, which Slurm may send up to a minute before the lead asked for (and
#: false when the controller does not answer: no reason to leave).
PREEMPTED_SHELL = 'scontrol show job -o "$SLURM_JOB_ID" | grep -q "PreemptTime=[0-9]"'
