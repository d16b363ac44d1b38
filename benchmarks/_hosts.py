"""Separate hosts for a benchmark (the loopback cluster's network namespaces, ``HOSTS=netns``:
``scripts/slurm-loopback.sh``), and a SIGTERM that ends a benchmark as Ctrl-C does, so that
what it brought up comes down. Used by the executor, allreduce and provider benchmarks."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.integration.slurm
from tests.integration import slurm  # noqa: E402

#: A command prefix that runs a command on a host (``{host}``) of a cluster's environment.
host_command = slurm.host_command


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def sigterm_as_interrupt() -> None:
    """From now on a SIGTERM raises KeyboardInterrupt: every ``finally`` and context runs (the
    processes a benchmark started are killed, its cluster or hosts removed)."""
    signal.signal(signal.SIGTERM, _interrupted)


@contextlib.contextmanager
def separate_hosts(count: int, directory: Path, ports: dict[str, int]) -> Iterator[dict[str, str]]:
    """Hosts ``n1`` … ``n<count>`` under ``directory`` on ``ports`` (``ctld_port``,
    ``base_port``: apart from the tests' and the other benchmarks', so that their bridges'
    nets differ too), up while the block runs and removed afterwards, errors, Ctrl-C and
    SIGTERM included; yields the environment of the cluster's commands (``PARSL_BF_ADDRESS``:
    where the hosts reach this machine). Exits with the reason where they cannot start."""
    if why := slurm.netns_unavailable():
        raise SystemExit(f"--hosts needs separate hosts, which cannot start here: {why}")
    sigterm_as_interrupt()
    with slurm.loopback_cluster(directory, count, hosts="netns", **ports) as env:
        yield env
