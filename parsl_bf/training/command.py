"""The command line of a fragment's ranks, defined once for the executor, the benchmarks and
the tests (``python -m parsl_bf.training.worker``'s flags are in :mod:`.worker`). Importing
this module does not start MPI."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["MPIEXEC", "WORKER_MODULE", "mpiexec_argv", "worker_argv"]

#: The module a rank runs (``python -m``).
WORKER_MODULE = "parsl_bf.training.worker"

#: The MPI launcher next to this Python (the PyPI MPICH wheel's).
MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))


def worker_argv(
    task: str,
    work: int,
    checkpoint_dir: str | Path,
    options: dict[str, Any] | None = None,
    **flags: Any,
) -> list[str]:
    """One rank's command: ``python -m parsl_bf.training.worker --task TASK --work WORK
    --checkpoint-dir DIR --options JSON`` and ``flags`` as ``--kebab-case VALUE`` (None: left
    out), e.g. ``report=…, result=…, checkpoint_every=20, after=…, stop_at=…``."""
    argv = [sys.executable, "-m", WORKER_MODULE, "--task", task]
    argv += ["--options", json.dumps(options or {}), "--work", str(work)]
    argv += ["--checkpoint-dir", str(checkpoint_dir)]
    for key, value in flags.items():
        if value is not None:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def mpiexec_argv(
    ranks: int, hosts: Sequence[str] | None = None, mpiexec: str = MPIEXEC, per_node: int = 1
) -> list[str]:
    """``mpiexec -n RANKS [-ppn PER_NODE] [-hosts H1,H2,…]``, to put before
    :func:`worker_argv` (``-ppn``: a node's ranks consecutive, e.g. one per GPU)."""
    argv = [mpiexec, "-n", str(ranks)]
    if per_node > 1:
        argv += ["-ppn", str(per_node)]
    if hosts:
        argv += ["-hosts", ",".join(hosts)]
    return argv
