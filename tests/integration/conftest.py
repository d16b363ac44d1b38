"""The loopback Slurm cluster for the tests: real slurmctld and slurmd, one per fake node.

Needs root (the daemons run as root); `scripts/slurm-loopback.sh` installs the Debian
packages when they are missing. `make test` as root (as in CI) runs these; elsewhere they skip.
One cluster serves the whole session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ..waiting import until
from .slurm import run

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm-loopback.sh"


@pytest.fixture(scope="session")
def slurm_env(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the loopback Slurm cluster needs root: run `make test` as root (CI does)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip(
            "Slurm is not installed and there is no apt-get to install it "
            "(Debian: slurmctld slurmd slurm-client)"
        )
    d = tmp_path_factory.mktemp("slurm")
    # Ports apart from a `make slurm-up` cluster that may be running.
    env = {
        **os.environ,
        "SLURM_LOOPBACK_DIR": str(d),
        "NNODES": "4",
        "GRACE_TIME": "10",
        "CTLD_PORT": "16817",
        "BASE_PORT": "27000",
    }
    subprocess.run([str(SCRIPT), "up"], env=env, check=True, timeout=900)
    yield {**env, "SLURM_CONF": str(d / "etc" / "slurm.conf")}
    subprocess.run([str(SCRIPT), "down"], env=env, timeout=60)


@pytest.fixture
def slurm(slurm_env, monkeypatch):
    """The cluster with SLURM_CONF set, every job cancelled afterwards."""
    monkeypatch.setenv("SLURM_CONF", slurm_env["SLURM_CONF"])
    yield slurm_env
    run(slurm_env, "scancel", "--full", "--user=root")
    until(lambda: not run(slurm_env, "squeue", "-h", "-t", "R,CG,PD").strip(), 60)
