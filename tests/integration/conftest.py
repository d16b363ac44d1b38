"""Fixtures of the integration tests.

The loopback Slurm cluster: real slurmctld and slurmd, one per fake node. Needs root (the
daemons run as root); `scripts/slurm-loopback.sh` installs the Debian packages when they are
missing. `make test` as root (as in CI) runs these; elsewhere they skip. One cluster serves the
whole session.

Pilot agents: a channel secret, servers and real agent processes, stopped after each test.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from parsl_bf.executor.channel import PilotServer
from parsl_bf.pilot.wire import read_secret, write_secret

from .agents import AGENT, Events, pilot_env
from .fragments import rank
from .slurm import loopback_cluster, netns_unavailable, quiesce, unavailable


def _ports(ctld_port: int, base_port: int) -> dict[str, int]:
    """A session's cluster ports, apart from the other sessions' of a parallel run (pytest-xdist
    worker ``gwN``: N × 2 further on, so its netns bridge, ``10.213.<port mod 250>``, differs
    too) and from a `make slurm-up` cluster that may be running."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    n = int(worker) if worker.isdigit() else 0
    return {"ctld_port": ctld_port + 2 * n, "base_port": base_port + 50 * n}


@pytest.fixture(scope="session")
def slurm_env(tmp_path_factory):
    if why := unavailable():
        pytest.skip(why)
    directory = tmp_path_factory.mktemp("slurm")
    with loopback_cluster(directory, 4, grace_s=10, **_ports(16817, 27000)) as env:
        yield env


@pytest.fixture(scope="session")
def hosts_env(tmp_path_factory):
    """A Slurm cluster of 4 separate hosts (``HOSTS=netns``): ranks on two of them talk over
    TCP. Its environment has ``PARSL_BF_ADDRESS``, where the hosts reach this machine."""
    if why := netns_unavailable():
        pytest.skip(why)
    directory = tmp_path_factory.mktemp("slurm-hosts")
    with loopback_cluster(directory, 4, grace_s=10, hosts="netns", **_ports(16917, 27100)) as env:
        yield env


@pytest.fixture
def hosts(hosts_env, monkeypatch):
    """The separate hosts' cluster with SLURM_CONF set, every job cancelled afterwards."""
    monkeypatch.setenv("SLURM_CONF", hosts_env["SLURM_CONF"])
    yield hosts_env
    quiesce(hosts_env, timeout=60)


@pytest.fixture
def slurm(slurm_env, monkeypatch):
    """The cluster with SLURM_CONF set, every job cancelled afterwards."""
    monkeypatch.setenv("SLURM_CONF", slurm_env["SLURM_CONF"])
    yield slurm_env
    quiesce(slurm_env, timeout=60)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    write_secret(tmp_path / "secret")
    return tmp_path / "secret"


@pytest.fixture
def serve(secret_file: Path) -> Iterator:
    """``serve(heartbeat_timeout_s=..., secret=..., **PilotServer options) -> (server,
    events)``, stopped after the test."""
    servers: list[PilotServer] = []

    def start(heartbeat_timeout_s: float = 10.0, secret: bytes | None = None, **kw):
        events = Events()
        secret = secret or read_secret(secret_file)
        server = PilotServer(secret, events, heartbeat_timeout_s=heartbeat_timeout_s, **kw)
        server.start()
        servers.append(server)
        return server, events

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def agent(tmp_path: Path, secret_file: Path) -> Iterator:
    """``agent(url, pilot, *args, env=...) -> Popen`` of ``python -m parsl_bf.pilot.agent``
    (``env``: added to the pilot's), its
    stderr appended to ``tmp_path / "<pilot>.stderr"``; any still running after the test get
    SIGTERM (which they forward to their processes), then SIGKILL."""
    procs: list[subprocess.Popen] = []

    def start(
        url: str,
        pilot: str = "pilot.1",
        *args: str,
        secret: Path = secret_file,
        env: dict[str, str] | None = None,
    ):
        argv = [*AGENT, "--url", url, "--secret-file", str(secret), "--heartbeat-s", "0.2"]
        with open(tmp_path / f"{pilot}.stderr", "a") as err:
            proc = subprocess.Popen([*argv, *args], env=pilot_env(pilot) | (env or {}), stderr=err)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def launch() -> Iterator:
    """``launch(tmp, work, **worker flags) -> Popen``: one rank, its own ``mpiexec -n 1`` as
    the executor's warm ranks are (:func:`.fragments.rank`); any still running after the
    test are killed, so that a failed assertion leaves no rank training."""
    procs: list[subprocess.Popen] = []

    def start(tmp: Path, work: int, **flags) -> subprocess.Popen:
        procs.append(rank(tmp, work, **flags))
        return procs[-1]

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
