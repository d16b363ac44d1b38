"""SlurmBackfillProvider on the loopback Slurm cluster: pilots sized to the hole, preempted by a
main job at no cost to it, and a stock HighThroughputExecutor that finishes every app anyway.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from parsl.jobs.states import JobState
from parsl.launchers import SimpleLauncher, SrunLauncher

from parsl_bf.providers import SlurmBackfillProvider

from ..waiting import until
from .htex import square, stock_htex
from .slurm import hole_left_by, job, run, sbatch, start_delay

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
GRACE_S = 10  # the cluster's GraceTime (conftest)


def _provider(tmp_path: Path, **kw) -> SlurmBackfillProvider:
    p = SlurmBackfillProvider(
        **{"min_walltime": "00:01:00", "max_walltime": "00:10:00", "launcher": SimpleLauncher()}
        | kw
    )
    p.script_dir = str(tmp_path)
    return p


def test_pilot_sized_to_the_hole_then_preempted(slurm, tmp_path: Path) -> None:
    busy = sbatch(slurm, "main", 2, "sleep 600", "--time=4")
    until(lambda: job(slurm, busy)["JobState"] == "RUNNING", 30)
    waiting = sbatch(slurm, "main", 4, "sleep 1", "--time=1")
    p = _provider(tmp_path)
    # The backfill scheduler plans `waiting` on all 4 nodes when `busy` ends (<= 4 min): the
    # hole is the 2 other nodes, for whole minutes up to then.
    until(lambda: len([h for h in p._holes(time.time()) if h.window_s]) == 2, 60)
    nodes = tmp_path / "nodes"
    pilot_id = p.submit(f"echo $PARSL_BF_NODES > {nodes}; sleep 600", 1)
    pilot = p.pilots[pilot_id]
    until(lambda: p.status([pilot_id])[0].state is JobState.RUNNING, 60)
    assert sorted(pilot.nodes) == hole_left_by(slurm, busy)
    assert 60 <= pilot.ends_at - pilot.started_at <= 240
    until(nodes.exists, 30)
    assert sorted(nodes.read_text().strip().split(",")) == sorted(pilot.nodes)  # it knows them
    # A main job that needs the pilot's nodes: the pilot leaves on the signal at once.
    run(slurm, "scancel", waiting)
    main = sbatch(slurm, "main", 2, "sleep 5", "--time=1")
    until(lambda: job(slurm, main)["JobState"] in ("RUNNING", "COMPLETED"), 60)
    assert start_delay(slurm, main) <= GRACE_S + 6
    until(lambda: p.status([pilot_id])[0].terminal, 60)
    assert (pilot.state, pilot.reason) == (JobState.TIMEOUT, "preempted")
    assert pilot.signalled_at is not None
    assert "preempted, exiting" in Path(p.resources[pilot_id]["job_stderr_path"]).read_text()
    run(slurm, "scancel", busy)


def test_a_cancel_after_an_unpolled_preemption_keeps_the_preemption(slurm, tmp_path: Path) -> None:
    # The executor's shutdown (or a scale-in) may cancel a pilot that the scheduler preempted
    # after the provider's last poll: the pilot's end is still the scheduler's.
    p = _provider(tmp_path, max_nodes=4)
    pilot_id = p.submit("sleep 600", 1)
    until(lambda: p.status([pilot_id])[0].state is JobState.RUNNING, 60)
    scheduler_id = p.pilots[pilot_id].scheduler_id
    main = sbatch(slurm, "main", 4, "sleep 1", "--time=1")  # needs the pilot's nodes
    until(lambda: job(slurm, scheduler_id).get("PreemptTime", "None") != "None", 60)
    assert p.pilots[pilot_id].state is JobState.RUNNING  # not polled since
    p.cancel([pilot_id])
    pilot = p.pilots[pilot_id]
    assert (pilot.state, pilot.reason) == (JobState.TIMEOUT, "preempted")
    assert p.cancel([pilot_id]) == [False]  # ended once
    until(lambda: job(slurm, main)["JobState"] in ("RUNNING", "COMPLETED"), 60)
    # A pilot that nothing preempted is our own cancel.
    other = p.submit("sleep 600", 1)
    until(lambda: p.status([other])[0].state is JobState.RUNNING, 90)
    assert p.cancel([other]) == [True]
    assert (p.pilots[other].state, p.pilots[other].reason) == (JobState.CANCELLED, "cancelled")


def test_stock_htex_finishes_every_app_through_a_preemption(
    slurm, tmp_path: Path, monkeypatch
) -> None:
    import parsl

    busy = sbatch(slurm, "main", 2, "sleep 600", "--time=5")
    until(lambda: job(slurm, busy)["JobState"] == "RUNNING", 30)
    # The issue's usage, with the workers' environment of this checkout.
    provider = SlurmBackfillProvider(
        partition="backfill",
        min_nodes=1,
        max_nodes=4,
        min_walltime="00:01:00",
        max_walltime="00:10:00",
        launcher=SrunLauncher(),
        worker_init=f"export PATH={Path(sys.executable).parent}:$PATH PYTHONPATH={ROOT}",
        max_blocks=1,
        status_polling_interval=1,
    )
    with parsl.load(stock_htex(provider, tmp_path / "runinfo", monkeypatch, retries=3)):
        assert [f.result(timeout=120) for f in [square(i) for i in range(4)]] == [0, 1, 4, 9]
        first = next(p for p in provider.pilots.values() if p.state is JobState.RUNNING)
        assert sorted(first.nodes) == hole_left_by(slurm, busy)
        futures = [square(i, 2.0) for i in range(12)]
        until(lambda: any(f.done() for f in futures), 60)
        main = sbatch(slurm, "main", 2, "sleep 10", "--time=1")  # needs the pilot's nodes
        until(lambda: job(slurm, main)["JobState"] in ("RUNNING", "COMPLETED"), 60)
        assert start_delay(slurm, main) <= GRACE_S + 6  # zero cost to the main queue
        # Lost tasks are retried on the next pilot, submitted once `main` leaves a hole.
        assert [f.result(timeout=240) for f in futures] == [i * i for i in range(12)]
        assert first.state is JobState.TIMEOUT and first.reason == "preempted"
        assert len(provider.pilots) >= 2
    run(slurm, "scancel", busy)


def test_bad_input_gets_the_schedulers_message_and_leaves_nothing(slurm, tmp_path: Path) -> None:
    from parsl.providers.errors import SubmitException

    cases = [
        (_provider(tmp_path / "a", partition="nope"), "nope"),
        # sbatch refuses (a QOS is only checked with an accounting database, not here).
        (
            _provider(tmp_path / "b", scheduler_options="#SBATCH --constraint=nosuch"),
            "invalid feature specification",
        ),
    ]
    # A controller that does not answer: a copy of the configuration on another port.
    conf = tmp_path / "down.conf"
    text = Path(slurm["SLURM_CONF"]).read_text()
    conf.write_text(text.replace(f"SlurmctldPort={slurm['CTLD_PORT']}", "SlurmctldPort=1"))
    for provider, words in cases:
        with pytest.raises(SubmitException) as err:
            provider.submit("sleep 1", 1)
        assert words in str(err.value).lower()
        assert provider.pilots == {} and not list(Path(provider.script_dir).glob("*.submit"))
    down = _provider(tmp_path / "c", cmd_timeout=20)
    os.environ["SLURM_CONF"] = str(conf)  # restored by the fixture's monkeypatch
    with pytest.raises(SubmitException) as err:
        down.submit("sleep 1", 1)
    assert "unable to contact slurm controller" in str(err.value).lower()
    assert down.pilots == {}


def test_a_pilot_that_missed_its_hole_is_withdrawn_and_sized_again(slurm, tmp_path: Path) -> None:
    # --begin keeps the pilot pending in Slurm, as when a main job took its hole first.
    p = _provider(tmp_path, pending_timeout_s=3, scheduler_options="#SBATCH --begin=now+600")
    pilot_id = p.submit("sleep 60", 1)
    first = p.pilots[pilot_id].scheduler_id
    assert first is not None
    until(lambda: p.status([pilot_id]) and p.pilots[pilot_id].scheduler_id not in (first,), 30)
    assert job(slurm, first)["JobState"] == "CANCELLED"
    # Sized again at once (the cluster is idle) and submitted as a new job.
    until(lambda: p.status([pilot_id]) and p.pilots[pilot_id].scheduler_id is not None, 30)
    assert p.pilots[pilot_id].scheduler_id != first
    assert p.status([pilot_id])[0].state is JobState.PENDING


def test_a_range_pilot_started_smaller_reports_its_size_and_launches_at_it(
    slurm, tmp_path: Path
) -> None:
    # Slurm sizes the pilot (1-4 nodes): with 2 nodes busy it starts on the other 2.
    busy = sbatch(slurm, "main", 2, "sleep 600", "--time=10")
    until(lambda: job(slurm, busy)["JobState"] == "RUNNING", 30)
    p = _provider(tmp_path, max_nodes=4, sizing="scheduler", launcher=SrunLauncher())
    seen = tmp_path / "seen"
    # \\$: srun runs the command in the step, where its task count is set.
    pilot_id = p.submit(f"echo \\$SLURM_STEP_NUM_TASKS $PARSL_BF_PILOT_END >> {seen}; sleep 600", 1)
    pilot = p.pilots[pilot_id]
    assert (
        "--nodes=1-4"
        in Path(p.resources[pilot_id]["job_stdout_path"]).with_suffix(".submit").read_text()
    )
    until(lambda: p.status([pilot_id])[0].state is JobState.RUNNING, 60)
    assert sorted(pilot.nodes) == hole_left_by(slurm, busy)
    # srun was told the 2 tasks of the size Slurm chose (with 4 it would not start), and the
    # pilot's end is the one Slurm granted.
    until(lambda: seen.exists() and len(seen.read_text().splitlines()) == 2, 60)
    text = seen.read_text()
    lines = {ln.split()[0]: ln.split()[-1] for ln in text.splitlines() if len(ln.split()) == 2}
    assert len(lines) == 1, text
    assert list(lines) == ["2"]
    assert abs(float(lines["2"]) - pilot.ends_at) <= 1
    main = sbatch(slurm, "main", 2, "sleep 5", "--time=1")  # needs the pilot's nodes
    until(lambda: p.status([pilot_id])[0].terminal, 90)
    assert (pilot.state, pilot.reason) == (JobState.TIMEOUT, "preempted")
    until(lambda: job(slurm, main)["JobState"] in ("RUNNING", "COMPLETED"), 60)
    run(slurm, "scancel", busy)


def test_a_time_min_pilot_in_a_short_hole_reports_the_shortened_end_and_leaves_at_it(
    slurm, tmp_path: Path
) -> None:
    # 2 nodes busy for 3 minutes and a 4-node main job planned after them: Slurm's backfill
    # may start the pilot only with a walltime shorter than the 10 minutes it asks for.
    busy = sbatch(slurm, "main", 2, "sleep 600", "--time=3")
    until(lambda: job(slurm, busy)["JobState"] == "RUNNING", 30)
    waiting = sbatch(slurm, "main", 4, "sleep 1", "--time=1")
    p = _provider(tmp_path, max_nodes=4, sizing="scheduler", status_polling_interval=1)
    ends = tmp_path / "ends"
    pilot_id = p.submit(f"echo $PARSL_BF_PILOT_END > {ends}; sleep 600", 1)
    pilot = p.pilots[pilot_id]
    until(lambda: p.status([pilot_id])[0].state is JobState.RUNNING, 60)
    granted = pilot.ends_at - pilot.started_at
    assert 60 <= granted < 600
    until(ends.exists, 30)
    assert abs(float(ends.read_text()) - pilot.ends_at) <= 1  # the pilot knows its real end
    until(lambda: p.status([pilot_id])[0].terminal, granted + 90)
    assert (pilot.state, pilot.reason) == (JobState.TIMEOUT, "walltime")  # not preempted
    assert "signalled, exiting" in Path(p.resources[pilot_id]["job_stderr_path"]).read_text()
    assert job(slurm, waiting)["JobState"] == "PENDING"  # it left before the hole closed
    run(slurm, "scancel", busy, waiting)
