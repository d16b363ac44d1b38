"""The loopback Slurm cluster (``scripts/slurm-loopback.sh``) and small helpers for what runs on
it: the ``slurm_env`` fixture and ``benchmarks/provider.py`` bring one up with
:func:`loopback_cluster`; the other helpers take the environment it yields."""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from parsl_bf.providers.slurm.commands import parse_job

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm-loopback.sh"


def host_command(env: dict[str, str]) -> str:
    """The command prefix that runs a command on host ``{host}`` of the ``HOSTS=netns``
    cluster of ``env`` (``slurm-loopback.sh on``, told which cluster by its directory and
    controller port): a ``LocalBackfillProvider``'s ``host_command``."""
    return (
        f"env SLURM_LOOPBACK_DIR={shlex.quote(env['SLURM_LOOPBACK_DIR'])} "
        f"CTLD_PORT={env['CTLD_PORT']} {shlex.quote(str(SCRIPT))} on {{host}}"
    )


def unavailable() -> str | None:
    """Why no loopback cluster can start on this machine; None when one can."""
    if os.geteuid() != 0:
        return "the loopback Slurm cluster needs root (its daemons run as root; CI runs as root)"
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        return (
            "Slurm is not installed and there is no apt-get to install it "
            "(Debian: slurmctld slurmd slurm-client)"
        )
    return None


def netns_unavailable() -> str | None:
    """Why no cluster of separate hosts (``HOSTS=netns``) can start here; None when one can."""
    if why := unavailable():
        return why
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"separate hosts need {tool} (Debian: iproute2, util-linux)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"network namespaces are not available here: {probe.stderr.strip()}"
    return None


@contextmanager
def loopback_cluster(
    directory: str | Path,
    nodes: int,
    *,
    ctld_port: int,
    base_port: int,
    grace_s: int = 10,
    preempt_mode: str = "REQUEUE",
    hosts: str = "loopback",
) -> Iterator[dict[str, str]]:
    """A cluster of ``nodes`` fake nodes (``n1`` …) configured and run under ``directory``,
    on ports apart from other clusters'; yields the environment of its commands (with
    ``SLURM_CONF``; with ``hosts="netns"`` each node a host of its own, and
    ``PARSL_BF_ADDRESS`` the machine's address on their bridge). Stopped on leaving, errors
    included. Needs root (:func:`unavailable`).
    Another session's cluster on the same ports is waited for (:func:`ports_lock`)."""
    env = {
        **os.environ,
        "SLURM_LOOPBACK_DIR": str(directory),
        "NNODES": str(nodes),
        "GRACE_TIME": str(grace_s),
        "PREEMPT_MODE": preempt_mode,
        "CTLD_PORT": str(ctld_port),
        "BASE_PORT": str(base_port),
        "HOSTS": hosts,
    }
    with ports_lock(ctld_port):
        try:
            subprocess.run([str(SCRIPT), "up"], env=env, check=True, timeout=900)
            exported = dict(
                line.removeprefix("export ").split("=", 1)
                for line in (Path(directory) / "env.sh").read_text().splitlines()
                if line.startswith("export ")
            )
            yield {**env, **exported}
        finally:
            subprocess.run([str(SCRIPT), "down"], env=env, timeout=120)


@contextmanager
def ports_lock(ctld_port: int) -> Iterator[None]:
    """Hold the lock of a loopback cluster's ports (the script's ``lockfile``): two test
    sessions on one machine take turns instead of breaking each other's cluster."""
    env = {**os.environ, "CTLD_PORT": str(ctld_port)}
    path = subprocess.run(
        [str(SCRIPT), "lockfile"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"slurm-loopback: waiting for another session's cluster ({path})", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run(env, *args: str, check: bool = True, timeout: float = 60) -> str:
    """A command against the cluster of ``env``; its stdout. With ``check``, a failure raises
    with the command's stderr."""
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def sbatch(env, partition: str, nodes: int, command: str, *options: str) -> str:
    """Submit ``command`` on ``nodes`` nodes of ``partition``; the job id."""
    out = run(
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
    )
    return out.split(";")[0].strip()  # "id;cluster" on a federation


def job(env, job_id: str) -> dict[str, str]:
    text = run(env, "scontrol", "show", "job", job_id)
    return dict(re.findall(r"(\w+)=(\S*)", text))


def jobs(env) -> dict[str, dict[str, str]]:
    """Every job the controller remembers (MinJobAge: 300 s after its end): id → its fields."""
    out = run(env, "scontrol", "show", "job", "-o", check=False)
    return {f["JobId"]: f for f in map(parse_job, out.splitlines()) if "JobId" in f}


def hostnames(env, hostlist: str) -> list[str]:
    """A Slurm host list (``n[1-3]``) expanded."""
    return run(env, "scontrol", "show", "hostnames", hostlist).split()


def quiesce(env, nodes: int = 0, timeout: float = 120, settle_s: float = 0.0) -> None:
    """Cancel every job and wait until the queue is empty and (``nodes`` > 0) that many nodes
    of ``main`` are idle, then ``settle_s`` more (a scheduler cycle with nothing to plan)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run(env, "scancel", "--full", "--user=root", check=False)
        if not run(env, "squeue", "-h", "-o", "%i", check=False).strip():
            out = run(env, "sinfo", "-h", "-N", "-p", "main", "-o", "%N|%T") if nodes else ""
            if sum(line.strip().endswith("|idle") for line in out.splitlines()) >= nodes:
                time.sleep(settle_s)
                return
        time.sleep(0.5)
    raise RuntimeError(f"the cluster did not become idle in {timeout:.0f} s")


def start_delay(env, job_id: str) -> float:
    """Seconds from a job's submission to its start (Slurm's own time stamps)."""
    fields = job(env, job_id)
    fmt = "%Y-%m-%dT%H:%M:%S"
    return time.mktime(time.strptime(fields["StartTime"], fmt)) - time.mktime(
        time.strptime(fields["SubmitTime"], fmt)
    )


def hole_left_by(env, job_id: str, nodes: int = 4) -> list[str]:
    """The cluster's nodes that the running job does not use, sorted."""
    used = hostnames(env, job(env, job_id)["NodeList"])
    return sorted(set(f"n{i}" for i in range(1, nodes + 1)) - set(used))
