"""Every PBS Pro command the backfill provider runs, and the parsing of their output.

All queries use PBS's JSON output (``-F json``). Hole discovery: a *hole* is a vnode that can
run the pilot's queue (its ``queue`` attribute, or the queue's ``default_chunk`` matched against
the vnode's ``resources_available``, as PBS matches a chunk), in state ``free`` with no job on
it, and how long it stays free: until the earliest ``estimated.start_time`` of a queued job
whose ``estimated.exec_vnode`` (the scheduler's backfill plan for its top jobs) includes it;
None when no queued job is planned there. PBS prints times in the server's local time.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from ..base import SchedulerError
from ..sizing import Hole

__all__ = [
    "NODE_LIST_SHELL",
    "Hole",
    "PBSCommandError",
    "check_queue",
    "exec_vnodes",
    "holes",
    "parse_estimates",
    "parse_jobs",
    "parse_pbsnodes",
    "parse_queues",
    "pbs_time",
    "qdel",
    "qsub",
    "queue_nodes",
    "show_job",
]

Runner = Callable[[Sequence[str]], str]

#: Job states in which the scheduler's ``estimated`` plan is for a start still to come.
_PLANNED = {"Q"}


class PBSCommandError(SchedulerError):
    """A PBS command failed; the message has the command and its stderr."""


def run(args: Sequence[str], timeout: float = 30.0) -> str:
    """Run a PBS command; its stdout, or :class:`PBSCommandError`."""
    try:
        proc = subprocess.run(
            list(args), capture_output=True, text=True, errors="replace", timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PBSCommandError(f"{' '.join(args)}: {exc}") from None
    if proc.returncode != 0:
        raise PBSCommandError(f"{' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def _json(text: str, what: str) -> dict[str, Any]:
    try:
        # strict=False: PBS copies control characters of job attributes into its JSON as-is.
        data = json.loads(text, strict=False) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise PBSCommandError(f"{what}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PBSCommandError(f"{what}: unexpected JSON {type(data).__name__}")
    return data


def pbs_time(text: Any) -> float | None:
    """Seconds since the epoch of a PBS time stamp (``Thu Nov  9 13:05:50 2023``, local time)."""
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        return datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y").timestamp()
    except ValueError:
        return None


def exec_vnodes(spec: Any) -> list[str]:
    """``(a:ncpus=2)+(b:ncpus=2+c:ncpus=1)`` (``exec_vnode``) → ``["a", "b", "c"]``, unique."""
    out: list[str] = []
    if isinstance(spec, str):
        for chunk in re.split(r"[()+]", spec):
            name = chunk.split(":", 1)[0].strip()
            if name and name not in out:
                out.append(name)
    return out


def parse_pbsnodes(text: str) -> dict[str, dict[str, Any]]:
    """``pbsnodes -a -F json`` → vnode → its attributes (``state``, ``resources_available``...)."""
    nodes = _json(text, "pbsnodes -a -F json").get("nodes") or {}
    return {name: attrs for name, attrs in nodes.items() if isinstance(attrs, dict)}


def parse_queues(text: str) -> dict[str, dict[str, Any]]:
    """``qstat -Q -f -F json`` → queue → its attributes."""
    queues = _json(text, "qstat -Q -f -F json").get("Queue") or {}
    return {name: attrs for name, attrs in queues.items() if isinstance(attrs, dict)}


def parse_jobs(text: str) -> dict[str, dict[str, Any]]:
    """``qstat -f -F json [-x]`` → job id → its attributes; PBS omits ``Jobs`` when there are
    none."""
    jobs = _json(text, "qstat -f -F json").get("Jobs") or {}
    return {job_id: attrs for job_id, attrs in jobs.items() if isinstance(attrs, dict)}


def parse_estimates(jobs: dict[str, dict[str, Any]]) -> dict[str, tuple[float, str]]:
    """Queued jobs' backfill plan → vnode → (earliest ``estimated.start_time``, job id).

    Only queued jobs count: a running job keeps the estimate it started from, and a held job's
    estimate is stale (it does not start until released).
    """
    planned: dict[str, tuple[float, str]] = {}
    for job_id, job in jobs.items():
        estimated = job.get("estimated")
        if job.get("job_state") not in _PLANNED or not isinstance(estimated, dict):
            continue
        when = pbs_time(estimated.get("start_time"))
        if when is None:
            continue
        for node in exec_vnodes(estimated.get("exec_vnode")):
            if node not in planned or when < planned[node][0]:
                planned[node] = (when, job_id)
    return planned


def _matches(available: dict[str, Any], resource: str, wanted: Any) -> bool:
    """Whether a vnode offering ``available`` can host a chunk asking ``resource=wanted``."""
    have = available.get(resource)
    if isinstance(wanted, int | float) and not isinstance(wanted, bool):
        try:  # consumable: enough of it
            return have is not None and float(have) >= float(wanted)
        except (TypeError, ValueError):
            return False
    wanted_s = str(wanted)
    if wanted_s.lower() in ("true", "false"):  # boolean: an unset one is False
        return str(have if have is not None else "False").lower() == wanted_s.lower()
    return have is not None and str(have) == wanted_s


def queue_nodes(
    nodes: dict[str, dict[str, Any]], queue: str, queue_info: dict[str, Any]
) -> list[str]:
    """The vnodes where jobs of ``queue`` can run.

    Vnodes whose ``queue`` attribute names the queue, if any do (PBS then runs the queue's jobs
    only there); otherwise the vnodes tied to no queue that satisfy the queue's
    ``default_chunk`` (merged into every chunk of its jobs) as PBS matches a chunk: string
    resources equal, booleans equal (unset is False), numbers at least as large.
    """
    tied = [name for name, attrs in nodes.items() if attrs.get("queue") == queue]
    if tied:
        return tied
    chunk = queue_info.get("default_chunk") or {}
    out = []
    for name, attrs in nodes.items():
        if attrs.get("queue"):
            continue
        available = attrs.get("resources_available") or {}
        if all(_matches(available, key, value) for key, value in chunk.items()):
            out.append(name)
    return out


def check_queue(queue: str, runner: Runner = run) -> dict[str, Any]:
    """The queue's attributes; :class:`PBSCommandError` if the pilots cannot run there.

    PBS's own message when the queue does not exist; a refusal when it is not an enabled,
    started execution queue (a route queue forwards by size and walltime, so a pilot sized to
    a hole may land where there is none).
    """
    info = parse_queues(runner(["qstat", "-Q", "-f", "-F", "json", queue])).get(queue)
    if info is None:
        raise PBSCommandError(f"qstat -Q {queue}: the queue is not in PBS's answer")
    if info.get("queue_type", "Execution") != "Execution":
        raise PBSCommandError(
            f"queue {queue} is a {info.get('queue_type')} queue: pilots need an execution queue"
        )
    for flag in ("enabled", "started"):
        if str(info.get(flag, "True")).lower() != "true":
            raise PBSCommandError(f"queue {queue} is not {flag} ({flag} = {info.get(flag)})")
    return info


def holes(
    queue: str, now: float, runner: Runner = run, queue_info: dict[str, Any] | None = None
) -> list[Hole]:
    """The queue's free vnodes and how long each stays free, longest first."""
    if queue_info is None:
        queue_info = check_queue(queue, runner)
    nodes = parse_pbsnodes(runner(["pbsnodes", "-a", "-F", "json"]))
    planned = parse_estimates(parse_jobs(runner(["qstat", "-f", "-F", "json"])))
    found = []
    for name in queue_nodes(nodes, queue, queue_info):
        attrs = nodes[name]
        # "free" alone: "free,resv-exclusive", "job-busy", "down", "offline"... run no pilot.
        # A free vnode with jobs on it is shared; a pilot asks for whole nodes.
        if attrs.get("state") != "free" or attrs.get("jobs"):
            continue
        when, job = planned.get(name, (None, None))
        found.append(Hole(name, "free", None if when is None else max(0.0, when - now), job))
    return sorted(found, key=lambda h: (h.window_s is not None, -(h.window_s or 0), h.node))


_JOB_ID = re.compile(r"\d+(\[\d*\])?(\.[\w.-]+)?")


def qsub(script: str, runner: Runner = run) -> str:
    """Submit a batch script file; the job id (``1234.server``)."""
    out = runner(["qsub", script]).strip()
    job_id = out.splitlines()[-1].strip() if out else ""
    if not _JOB_ID.fullmatch(job_id):
        raise PBSCommandError(f"qsub {script}: unexpected answer {out!r}")
    return job_id


def show_job(job_id: str, runner: Runner = run) -> dict[str, Any] | None:
    """``qstat -f -F json -x``'s attributes of a job (``-x``: finished jobs too); None once
    PBS forgot it (older than ``job_history_duration``, or history off)."""
    try:
        text = runner(["qstat", "-f", "-F", "json", "-x", job_id])
    except PBSCommandError as exc:
        if "Unknown Job Id" in str(exc):
            return None
        raise
    jobs = parse_jobs(text)
    if job_id in jobs:
        return jobs[job_id]
    # PBS may name the server differently from the id qsub printed (short or long host name).
    sequence = job_id.split(".", 1)[0]
    same = [attrs for key, attrs in jobs.items() if key.split(".", 1)[0] == sequence]
    return same[0] if len(same) == 1 else None


def qdel(job_ids: Sequence[str], runner: Runner = run) -> None:
    """Delete jobs (running ones get SIGTERM, then SIGKILL after the queue's ``kill_delay``).

    A job that already finished or that PBS forgot is gone anyway: not an error.
    """
    if not job_ids:
        return
    try:
        runner(["qdel", *job_ids])
    except PBSCommandError as exc:
        lines = str(exc).split(": exit ", 1)[-1].splitlines()
        if not all("Job has finished" in ln or "Unknown Job Id" in ln for ln in lines):
            raise


#: Run inside a job: its nodes, comma-separated.
NODE_LIST_SHELL = 'sort -u "$PBS_NODEFILE" | paste -sd, -'
