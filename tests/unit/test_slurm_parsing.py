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
