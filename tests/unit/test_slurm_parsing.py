"""Parsing of Slurm output for hole discovery, on output recorded from the loopback cluster
(scripts/slurm-loopback.sh, Slurm 22.05): two nodes busy with a job, a 4-node main job pending
with a planned start. The same scenario runs live in tests/integration/test_slurm_loopback.py.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from parsl_bf.providers.slurm.commands import holes, parse_sinfo_nodes, parse_squeue_start

SINFO = "n1|allocated\nn2|allocated\nn3|planned\nn4|planned\n"
SQUEUE = "2|main|2026-11-30T04:30:20|n[1-4]\n3|main|N/A|(null)\n"
EXPANDED = {"n[1-4]": "n1\nn2\nn3\nn4\n"}
START = datetime(2026, 11, 30, 4, 30, 20).timestamp()


def _runner(args):
    if args[0] == "sinfo":
        return SINFO
    if args[0] == "squeue":
        return SQUEUE
    return EXPANDED[args[-1]]


def test_parsers() -> None:
    assert parse_sinfo_nodes(SINFO) == {
        "n1": "allocated",
        "n2": "allocated",
        "n3": "planned",
        "n4": "planned",
    }
    planned = parse_squeue_start(SQUEUE, lambda h: EXPANDED[h].split())
    assert planned == {n: (START, "2") for n in ("n1", "n2", "n3", "n4")}


def test_holes_are_idle_nodes_with_their_window() -> None:
    found = holes("backfill", START - 113.5, _runner)
    assert [h.node for h in found] == ["n3", "n4"]
    assert all(h.window_s == pytest.approx(113.5) and h.blocking_job == "2" for h in found)
    # No pending job planned there: the window is unbounded (None), listed first.
    free = holes("backfill", START, lambda a: "n5|idle\n" if a[0] == "sinfo" else "")
    assert [(h.node, h.window_s) for h in free] == [("n5", None)]


def _recorded(name: str) -> dict[str, str]:
    from pathlib import Path

    from parsl_bf.providers.slurm.commands import parse_job

    here = Path(__file__).resolve().parents[1] / "data" / "slurm"
    return parse_job((here / f"show_job_{name}.txt").read_text())


def _expand(hostlist: str) -> list[str]:
    return {"n[3-4]": ["n3", "n4"], "n1": ["n1"], "n2": ["n2"]}[hostlist]


@pytest.mark.parametrize(
    "name, state, reason",
    [
        ("running", "RUNNING", ""),
        ("preempted", "TIMEOUT", "preempted"),
        ("cancelled", "CANCELLED", "cancelled"),
        ("walltime", "TIMEOUT", "walltime"),
    ],
)
def test_pilot_state_from_recorded_scontrol(name: str, state: str, reason: str) -> None:
    from parsl_bf.providers.slurm.provider import pilot_from_job

    fields = _recorded(name)
    pilot = pilot_from_job(fields, _expand, signal_lead_s=10)
    assert (pilot.state.name, pilot.reason) == (state, reason)
    assert pilot.scheduler_id == fields["JobId"] and pilot.started_at is not None
    if name in ("running", "preempted"):
        assert pilot.nodes == ["n3", "n4"]
    assert (pilot.signalled_at is not None) == (name == "preempted")


def test_a_pilot_that_left_on_its_walltime_notice_is_a_walltime_end() -> None:
    from parsl_bf.providers.slurm.provider import pilot_from_job

    fields = _recorded("walltime") | {"JobState": "COMPLETED", "EndTime": "2026-11-30T05:13:05"}
    assert pilot_from_job(fields, _expand, 10).reason == "walltime"  # ran 56 s of 60
    fields["EndTime"] = "2026-11-30T05:12:39"  # 30 s: it finished by itself
    assert pilot_from_job(fields, _expand, 10).state.name == "COMPLETED"
    fields |= {"JobState": "FAILED", "ExitCode": "3:0"}
    failed = pilot_from_job(fields, _expand, 10)
    assert (failed.state.name, failed.reason) == ("FAILED", "failed, exit code 3:0")
    pending = pilot_from_job(fields | {"JobState": "PENDING", "NodeList": "(null)"}, _expand, 10)
    assert pending.state.name == "PENDING" and pending.nodes == [] and pending.ends_at is None


def test_sbatch_and_show_job_answers() -> None:
    from parsl_bf.providers.slurm.commands import SlurmCommandError, sbatch, show_job

    assert sbatch("x.submit", lambda args: "42;loopback\n") == "42"
    with pytest.raises(SlurmCommandError, match="unexpected answer"):
        sbatch("x.submit", lambda args: "Submitted batch job 42\n")

    def forgotten(args):
        raise SlurmCommandError("scontrol: exit 1: slurm_load_jobs error: Invalid job id specified")

    assert show_job("7", forgotten) is None
