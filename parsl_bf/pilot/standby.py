"""A warm rank: a process that becomes one rank of a fragment without starting an interpreter.

    mpiexec -n 1 python -m parsl_bf.pilot.standby --connect SOCKET --token N [--nice]

A pilot's agent keeps a few of these per node (:mod:`parsl_bf.pilot.ranks`). Each is an MPI
job of one rank (so that ranks of different standbys can join one communicator through the
rendezvous of :mod:`.rendezvous`: MPICH gives every ``mpiexec`` a world of its own, which
singletons started without one do not have). It pays the start-up of a rank before any
fragment needs it: the interpreter, ``import torch``, ``MPI_Init`` and the first optimizer step
(which loads ``torch._dynamo``), together about 3 s here. Then it says ``ready`` (its pid and
token) on the agent's Unix socket and waits for one job, a JSON line::

    {"argv": [worker flags...], "env": {...}, "cwd": DIR, "stdout": FILE, "stderr": FILE}

It takes the job's output files as its own descriptors 1 and 2, its directory, environment and
``PYTHONPATH``, and runs :func:`parsl_bf.training.worker.main` on ``argv`` (every flag of
``python -m parsl_bf.training.worker``, with ``--group``/``--groups`` when the fragment has
more than one rank), then exits with its code. One job per standby: a rank's memory and
threads do not carry over to the next fragment. With ``--nice`` (a standby that replaces
one a fragment took, and starts while that fragment trains) it warms up at niceness 19 and
takes its niceness back with the job, where it may. Until the job comes, the default signal
dispositions hold (a TERM ends it at once: nothing was done) and the end of the socket (the
agent is gone) ends it too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

__all__ = ["JOB_KEYS", "MODULE", "main", "warm_up"]

#: The standby's module (``python -m``).
MODULE = "parsl_bf.pilot.standby"

#: The fields of a job.
JOB_KEYS = ("argv", "env", "cwd", "stdout", "stderr")


def warm_up() -> None:
    """Everything a rank pays before its first step that does not depend on the task."""
    import torch
    from mpi4py import MPI  # noqa: F401  (MPI_Init)

    from ..training import worker  # noqa: F401  (the trainer, checkpoints, reports)

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model(torch.zeros(1, 2)).sum().backward()
    optimizer.step()  # the first step of any optimizer imports torch._dynamo (about 1.5 s)


def _renice(value: int) -> bool:
    """Every thread of this process at niceness ``value`` (Linux niceness is per thread), and
    its scheduler autogroup too: with ``kernel.sched_autogroup_enabled``, a process alone in
    its session (as every rank is) competes with other sessions by its autogroup's niceness,
    not its own. False if not allowed (lowering it back needs a privilege or RLIMIT_NICE)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    try:
        for tid in tids:
            with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                os.setpriority(os.PRIO_PROCESS, tid, value)
    except PermissionError:
        return False
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
        f.write(str(value))  # absent without autogroups: the niceness above is what counts
    return True


def _read_job(sock: socket.socket) -> dict | None:
    buf = b""
    while b"\n" not in buf:
        data = sock.recv(65536)
        if not data:
            return None
        buf += data
        if len(buf) > 1 << 20:  # a job is a command line, not a payload
            raise ValueError("job line over 1 MiB")
    job = json.loads(buf.split(b"\n", 1)[0])
    if not isinstance(job, dict) or not isinstance(job.get("argv"), list):
        raise ValueError(f"not a job: {job!r}")
    return job


def _take(job: dict) -> None:
    """The job's output, directory, environment and import path become this process's."""
    for fd, key in ((1, "stdout"), (2, "stderr")):
        if job.get(key):
            Path(job[key]).parent.mkdir(parents=True, exist_ok=True)
            out = os.open(job[key], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(out, fd)
            os.close(out)
    if job.get("cwd"):
        os.chdir(job["cwd"])
    env = {str(k): str(v) for k, v in (job.get("env") or {}).items()}
    os.environ.update(env)
    if env.get("PYTHONPATH"):
        sys.path[:0] = [p for p in env["PYTHONPATH"].split(os.pathsep) if p]
        import importlib

        importlib.invalidate_caches()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=MODULE, description=__doc__)
    ap.add_argument("--connect", required=True, help="the agent's Unix socket")
    ap.add_argument("--token", type=int, required=True, help="who this is, to the agent")
    ap.add_argument(
        "--nice", action="store_true", help="warm up at niceness 19 (ranks train meanwhile)"
    )
    args = ap.parse_args(argv)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(args.connect)
    # Warm up (and refill, while a fragment trains on the node) at the lowest priority: the
    # imports must not slow the ranks that train meanwhile on the same cores.
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    if args.nice:
        _renice(19)
    warm_up()
    sock.sendall(json.dumps({"ready": os.getpid(), "token": args.token}).encode() + b"\n")
    job = _read_job(sock)
    if job is None:  # the agent closed: nothing to do
        return 0
    assigned_at = time.time()
    sock.close()
    if args.nice and not _renice(niceness):  # alone on its node, a rank trains as fast
        print(f"{MODULE}: rank stays at niceness 19", file=sys.stderr)
    _take(job)
    from ..training import worker

    return worker.main([str(a) for a in job["argv"]], started_at=assigned_at)


if __name__ == "__main__":
    from ..training.worker import run

    run(main)
