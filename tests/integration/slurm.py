"""Small helpers for tests on the loopback Slurm cluster (the ``slurm_env`` fixture)."""

from __future__ import annotations

import re
import subprocess
import time


def run(env, *args: str) -> str:
    return subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout


def sbatch(env, partition: str, nodes: int, command: str, *options: str) -> str:
    """Submit ``command`` on ``nodes`` nodes of ``partition``; the job id."""
    return run(
        env,
        "sbatch",
        "--parsable",
        "-p",
        partition,
        "-N",
        str(nodes),
        *options,
        "-o",
        "/dev/null",
        "--wrap",
        command,
    ).strip()


def job(env, job_id: str) -> dict[str, str]:
    text = run(env, "scontrol", "show", "job", job_id)
    return dict(re.findall(r"(\w+)=(\S*)", text))


def start_delay(env, job_id: str) -> float:
    """Seconds from a job's submission to its start (Slurm's own time stamps)."""
    fields = job(env, job_id)
    fmt = "%Y-%m-%dT%H:%M:%S"
    return time.mktime(time.strptime(fields["StartTime"], fmt)) - time.mktime(
        time.strptime(fields["SubmitTime"], fmt)
    )


def hole_left_by(env, job_id: str, nodes: int = 4) -> list[str]:
    """The cluster's nodes that the running job does not use, sorted."""
    used = run(env, "scontrol", "show", "hostnames", job(env, job_id)["NodeList"]).split()
    return sorted(set(f"n{i}" for i in range(1, nodes + 1)) - set(used))
