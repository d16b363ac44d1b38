"""The loopback Slurm cluster the Slurm provider is tested on: real slurmctld and slurmd.

Needs root (the daemons run as root); `scripts/slurm-loopback.sh` installs the Debian
packages when they are missing. `make test` as root (as in CI) runs these; elsewhere they skip.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from ..waiting import until
from .slurm import job as _job
from .slurm import run as _run
from .slurm import sbatch as _sbatch

pytestmark = pytest.mark.slow


def test_nodes_idle_in_both_partitions(slurm_env) -> None:
    out = _run(slurm_env, "sinfo", "-h", "-o", "%P %D %T")
    assert "main* 4 idle" in out and "backfill 4 idle" in out


def test_a_main_job_preempts_a_backfill_pilot_with_its_signal(slurm_env, tmp_path) -> None:
    mark = tmp_path / "usr1"
    pilot = _sbatch(
        slurm_env,
        "backfill",
        2,
        f"trap 'echo USR1 > {mark}; exit 0' USR1; sleep 300 & wait",
        "--signal=B:USR1@5",
    )
    until(
        lambda: _job(slurm_env, pilot).get("JobState") == "RUNNING", 60, "the pilot did not start"
    )
    main = _sbatch(slurm_env, "main", 4, "sleep 2")
    until(
        lambda: _job(slurm_env, pilot).get("PreemptTime", "None") != "None",
        120,
        "the pilot was not preempted",
    )
    # The batch shell got --signal's USR1 at the start of the grace time.
    until(mark.exists, 120, "no USR1 reached the pilot")
    until(
        lambda: _job(slurm_env, main).get("JobState") in ("RUNNING", "COMPLETED"),
        120,
        "the main job did not get the nodes",
    )
    subprocess.run(["scancel", pilot], env=slurm_env)


def test_holes_see_a_pending_jobs_planned_start(slurm_env, monkeypatch) -> None:
    from parsl_bf.providers.slurm import holes

    monkeypatch.setenv("SLURM_CONF", slurm_env["SLURM_CONF"])
    busy = _sbatch(slurm_env, "main", 2, "sleep 100", "--time=2")
    waiting = _sbatch(slurm_env, "main", 4, "sleep 1", "--time=1")
    try:
        found: list = []

        def planned() -> bool:  # the backfill scheduler plans the waiting job within cycles
            found[:] = holes("backfill", time.time())
            return len(found) == 2 and all(h.window_s is not None for h in found)

        until(planned, 60, "the waiting job's start was not planned on the idle nodes")
        assert {h.blocking_job for h in found} == {waiting}
        # The busy job's --time=2 ends within 2 minutes, and the waiting job starts then.
        assert all(0 < h.window_s <= 125 for h in found)
    finally:
        subprocess.run(["scancel", busy, waiting], env=slurm_env)
