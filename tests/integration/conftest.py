"""The loopback Slurm cluster for the tests: real slurmctld and slurmd, one per fake node.

Needs root (the daemons run as root); `scripts/slurm-loopback.sh` installs the Debian
packages when they are missing. `make test` as root (as in CI) runs these; elsewhere they skip.
One cluster serves the whole session.
"""

from __future__ import annotations

import pytest

from .slurm import loopback_cluster, quiesce, unavailable


@pytest.fixture(scope="session")
def slurm_env(tmp_path_factory):
    if why := unavailable():
        pytest.skip(why)
    # Ports apart from a `make slurm-up` cluster that may be running.
    directory = tmp_path_factory.mktemp("slurm")
    with loopback_cluster(directory, 4, grace_s=10, ctld_port=16817, base_port=27000) as env:
        yield env


@pytest.fixture
def slurm(slurm_env, monkeypatch):
    """The cluster with SLURM_CONF set, every job cancelled afterwards."""
    monkeypatch.setenv("SLURM_CONF", slurm_env["SLURM_CONF"])
    yield slurm_env
    quiesce(slurm_env, timeout=60)
