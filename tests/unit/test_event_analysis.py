"""A run's figures from a hand-written event log and progress reports, against numbers worked
out by hand (``parsl_bf.executor.analysis``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from parsl_bf.executor.analysis import (
    efficiency,
    load_run,
    node_time,
    node_time_series,
    percentile,
    run_figures,
)

T0, T_END, BATCH = 100.0, 200.0, 10

EVENTS = [
    {"t": 90, "event": "pilot_up", "pilot": "p1", "nodes": ["n1"]},  # up before t0
    {"t": 95, "event": "fragment_start", "task": "a", "nodes": 1},  # starts before t0
    {"t": 100, "event": "fragment_start", "task": "b", "nodes": 1},
    {"t": 110, "event": "pilot_up", "pilot": "p2", "nodes": ["n2", "n3"]},  # never gone
    {"t": 130, "event": "decision", "cause": "pilot_up", "seconds": 0.01, "actions": []},
    {"t": 138, "event": "fragment_stop", "task": "a", "generation": 0, "reason": "preempted"},
    {"t": 140, "event": "fragment_stopped", "task": "a", "samples": 700},
    {"t": 142, "event": "fragment_start", "task": "a", "nodes": 2},  # still running at t_end
    {"t": 150, "event": "pilot_gone", "pilot": "p1", "reason": "preempted"},
    {"t": 150, "event": "fragment_stop", "task": "b", "generation": 0, "reason": "rescale"},
    {"t": 160, "event": "fragment_stopped", "task": "z", "samples": 0},  # never started
    {"t": 170, "event": "task_done", "task": "b", "samples": 1000},
    {"t": 180, "event": "fragment_start", "task": "c", "nodes": 1},
    {"t": 185, "event": "fragment_stop", "task": "c", "generation": 0, "reason": "pilot gone"},
    {"t": 190, "event": "task_failed", "task": "c", "code": 1},
    {"t": 205, "event": "pilot_up", "pilot": "p3", "nodes": ["n4"]},  # after t_end
    {"t": 205, "event": "fragment_start", "task": "d", "nodes": 1},
    {"t": 210, "event": "fragment_stop", "task": "a", "generation": 1, "reason": "walltime"},
    {"t": 250, "event": "decision", "cause": "pilot_gone", "seconds": 0.02, "actions": []},
]

REPORTS = {
    "a": [
        {"t": 96, "event": "start", "world": 1, "samples": 0, "first_step_at": 97},
        {"t": 99, "event": "step", "world": 1, "samples": 100, "rate": 50.0},  # before t0
        {"t": 120, "event": "step", "world": 1, "samples": 500, "rate": 60.0},
        {"t": 139, "event": "stop", "samples": 700},
        # Resumed on 2 nodes from a checkpoint at 680 (first step done: 690): 700 - 680 again.
        {
            "t": 145,
            "event": "start",
            "world": 2,
            "samples": 690,
            "first_step_at": 146,
            "stopped_at": 140,
        },
        {"t": 160, "event": "step", "world": 2, "samples": 1500, "rate": 100.0},
        {"t": 210, "event": "step", "world": 2, "samples": 3000, "rate": 100.0},  # after t_end
    ],
    "b": [
        {"t": 101, "event": "start", "world": 1, "samples": 0, "first_step_at": 103},
        {"t": 150, "event": "step", "world": 1, "samples": 800, "rate": 70.0},
        {"t": 170, "event": "done", "samples": 1000},
    ],
    "c": [
        {"t": 181, "event": "note"},  # no samples: left out
        {"t": 182, "event": "start", "world": 1, "samples": 10, "first_step_at": 182.5},
    ],
    "e": [],
}


def test_figures_of_a_run() -> None:
    f = run_figures(EVENTS, REPORTS, T0, T_END, BATCH)
    # a: 1 node 100-140, 2 nodes 142-200; b: 1 node 100-170; c: 1 node 180-190; d after t_end.
    assert f.alloc_node_s == 40 + 2 * 58 + 70 + 10
    # p1: 100-150 (up at 90, clipped); p2: 2 nodes 110-200 (open at t_end); p3 after t_end.
    assert f.held_node_s == 50 + 2 * 90
    assert (f.fragments, f.pilots) == (4, 2)
    # a's "preempted" and c's "pilot gone" by t_end; b's "rescale" is none, a's "walltime" late.
    assert f.preemptions == 2
    assert f.decisions == [0.01, 0.02]  # every decision, at any time
    assert f.per_task == {"a": 1500, "b": 1000, "c": 10, "e": 0}
    assert f.samples == 2510
    assert f.lost == 700 - (690 - BATCH)
    # a: 97 - 95 and 146 - 142; b: 103 - 100; c: 182.5 - 180 (tasks in sorted order).
    assert f.startup_s == [2.0, 4.0, 3.0, 2.5]
    assert f.waited_s == [146 - 140]
    # None of these starts was a warm hand-over: a's restart waited for a node after its stop.
    assert (f.fresh_startup_s, f.handover_s) == ([2.0, 4.0, 3.0, 2.5], [])
    assert f.rates1 == [60.0, 70.0]  # 1-rank steps from t0 on
    # Spans between two step reports from t0 on: a's 99 → 120 began before t0, b has one step.
    assert (f.spans1, f.sustained1) == ([], None)


def test_the_sustained_rate_of_a_run_spans_its_one_rank_steps_from_t0() -> None:
    steps = [{"t": t, "event": "step", "world": 1, "samples": n, "rate": 1.0} for t, n in
             ((99, 0), (101, 100), (102, 200), (105, 300))]  # fmt: skip
    f = run_figures([], {"a": steps}, T0, T_END, BATCH)
    assert f.spans1 == [(100, 1), (100, 3)]
    assert f.sustained1 == pytest.approx(200 / 4)


def test_a_warm_hand_over_holds_the_larger_fragment_until_the_other_stops() -> None:
    events = [
        # g grows 1 → 2: its successor starts at 50, before its predecessor stops at 52.
        {"t": 0, "event": "fragment_start", "task": "g", "generation": 0, "nodes": 1},
        {"t": 50, "event": "fragment_start", "task": "g", "generation": 1, "nodes": 2, "after": 0},
        {"t": 52, "event": "fragment_stopped", "task": "g", "generation": 0, "samples": 9},
        # s shrinks 2 → 1, in a log whose events name no generation (the oldest stops).
        {"t": 0, "event": "fragment_start", "task": "s", "nodes": 2},
        {"t": 60, "event": "fragment_start", "task": "s", "nodes": 1, "after": 0},
        {"t": 62, "event": "fragment_stopped", "task": "s", "samples": 9},
        # d's predecessor ends the work during its hand-over: the task's end ends both.
        {"t": 0, "event": "fragment_start", "task": "d", "generation": 0, "nodes": 1},
        {"t": 70, "event": "fragment_start", "task": "d", "generation": 1, "nodes": 2, "after": 0},
        {"t": 75, "event": "task_done", "task": "d", "samples": 9},
    ]
    f = run_figures(events, {}, 0.0, 100.0, BATCH)
    assert f.alloc_node_s == (50 + 2 * 50) + (2 * 62 + 38) + (70 + 2 * 5)
    assert (f.fragments, f.startup_s) == (6, [])
    # g's reports: its first start is fresh; its successor's first step comes 1.5 s after its
    # predecessor's stop: a hand-over, not a fresh start.
    reports = {
        "g": [
            {"t": 1, "event": "start", "world": 1, "samples": 0, "first_step_at": 2},
            {"t": 51, "event": "stop", "samples": 900},
            {"t": 52, "event": "start", "world": 2, "samples": 910, "first_step_at": 52.5,
             "stopped_at": 51},
        ]
    }  # fmt: skip
    f = run_figures(events, reports, 0.0, 100.0, BATCH)
    assert (f.startup_s, f.fresh_startup_s) == ([2.0, 2.5], [2.0])
    assert (f.waited_s, f.handover_s) == ([1.5], [1.5])


def test_a_fragment_shrunk_in_place_holds_fewer_nodes_once_its_leavers_are_gone() -> None:
    events = [
        {"t": 0, "event": "fragment_start", "task": "s", "generation": 0, "nodes": 3},
        {"t": 40, "event": "fragment_shrunk", "task": "s", "generation": 0, "nodes": 1},
        {"t": 90, "event": "fragment_stopped", "task": "s", "generation": 0, "samples": 9},
    ]
    f = run_figures(events, {}, 0.0, 100.0, BATCH)
    assert f.alloc_node_s == 3 * 40 + 1 * 50


def test_a_restart_or_a_cold_start_ends_the_fragments_before_it() -> None:
    events = [
        # r's first fragment crashes at 5 and is restarted from its checkpoint at 6.
        {"t": 0, "event": "fragment_start", "task": "r", "generation": 0, "nodes": 1},
        {"t": 5, "event": "fragment_failed", "task": "r", "generation": 0, "code": 1},
        {"t": 6, "event": "fragment_start", "task": "r", "generation": 1, "nodes": 1},
        {"t": 10, "event": "fragment_stopped", "task": "r", "generation": 1, "samples": 9},
        # q's first fragment leaves no event of its end: its cold successor ends it at 30.
        {"t": 20, "event": "fragment_start", "task": "q", "generation": 0, "nodes": 2},
        {"t": 30, "event": "fragment_start", "task": "q", "generation": 1, "nodes": 1},
        {"t": 35, "event": "fragment_lost", "task": "q", "generation": 1, "code": -9},
    ]
    f = run_figures(events, {}, 0.0, 100.0, BATCH)
    assert f.alloc_node_s == (5 + 4) + (2 * 10 + 5)


def test_a_resume_that_loses_nothing_counts_zero() -> None:
    reports = {
        "a": [
            {"t": 100, "event": "start", "world": 1, "samples": 10, "first_step_at": 100},
            {"t": 110, "event": "stop", "samples": 800},
            # Resumed at 800, first step done: 810 (a shorter last step at an epoch's end would
            # show as up to one batch lost: the figure's stated overcount).
            {"t": 120, "event": "start", "world": 1, "samples": 810, "first_step_at": 121},
        ]
    }
    f = run_figures([], reports, 0.0, 200.0, BATCH)
    assert (f.lost, f.samples, f.alloc_node_s, f.startup_s) == (0, 810, 0.0, [])


def test_efficiency_is_the_replay_accounting() -> None:
    # 2,000 samples at P(1) = 10 samples/s are 200 node-seconds' worth.
    assert efficiency(2000, 10.0, 250.0, 400.0) == {
        "util": 0.625,
        "E_used": 0.8,
        "E_avail": 0.5,
    }
    assert efficiency(0, 10.0, 0.0, 400.0) == {"util": 0.0, "E_used": 0.0, "E_avail": 0.0}


def test_percentile_interpolates_as_numpy() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]
    assert [percentile(xs, q) for q in (0, 25, 50, 100)] == [1.0, 1.75, 2.5, 4.0]
    assert percentile(xs, 95) == pytest.approx(float(np.percentile(xs, 95)))
    assert percentile([5.0], 95) == 5.0
    assert percentile([], 50) is None


def test_load_run_reads_events_and_each_tasks_reports(tmp_path: Path) -> None:
    lines = [json.dumps(e) for e in EVENTS[:3]]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + '\n{"t": 1')  # cut last line
    for task, reports in REPORTS.items():
        d = tmp_path / "tasks" / task
        d.mkdir(parents=True)
        (d / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reports))
    events, reports = load_run(tmp_path)
    assert events == EVENTS[:3]
    assert reports == REPORTS


# One 2-node pilot for 20 s; a 1-node fragment started at 1, first step at 3, steps to 11,
# stopped at 12: 8 s training, 2 s start-up, 1 s held otherwise, 29 s on no task.
SPLIT_EVENTS = [
    {"t": 0, "event": "pilot_up", "pilot": "p", "nodes": ["n1", "n2"]},
    {"t": 1, "event": "fragment_start", "task": "a", "nodes": 1},
    {"t": 12, "event": "fragment_stopped", "task": "a", "samples": 50},
    {"t": 20, "event": "pilot_gone", "pilot": "p", "reason": "walltime"},
]
SPLIT_REPORTS = {
    "a": [
        {"t": 3.0, "event": "start", "world": 1, "samples": 0, "first_step_at": 3.0},
        *(
            {"t": float(t), "event": "step", "world": 1, "samples": 10 * t, "rate": 5.0}
            for t in range(3, 12, 2)
        ),
    ]
}


def test_where_the_node_time_went() -> None:
    assert node_time(SPLIT_EVENTS, SPLIT_REPORTS) == {
        "offered": 40.0,
        "training": 8.0,
        "start_up": 2.0,
        "other_held": 1.0,
        "no_work": 29.0,
    }
    assert node_time([], {}) == {}


def test_where_the_node_time_went_over_time() -> None:
    got = node_time_series(SPLIT_EVENTS, SPLIT_REPORTS, [0.5, 2.0, 5.0, 11.5, 25.0])
    assert got == {
        "offered": [2, 2, 2, 2, 0],
        "training": [0, 0, 1, 0, 0],
        "start_up": [0, 1, 0, 0, 0],
    }


def test_rescale_times_run_from_each_decision_to_the_first_step_at_the_new_size() -> None:
    events = [
        {"t": 100.0, "event": "fragment_start", "task": "a", "nodes": 1},  # a start, not a rescale
        {"t": 110.0, "event": "fragment_grow", "task": "a", "generation": 0, "nodes": 2},
        {"t": 130.0, "event": "fragment_shrink", "task": "a", "generation": 0, "keep": ["n1"]},
        {"t": 150.0, "event": "fragment_start", "task": "a", "nodes": 2, "after": 0},
        {"t": 190.0, "event": "fragment_grow", "task": "a", "generation": 1, "nodes": 3},
        {"t": 195.0, "event": "fragment_grow", "task": "z", "generation": 0, "nodes": 3},
    ]
    reports = {
        "a": [
            {"t": 101.5, "event": "start", "world": 1, "samples": 10, "first_step_at": 101.5},
            {"t": 112.0, "event": "grown", "world": 2, "samples": 50, "first_step_at": 111.5},
            {"t": 131.0, "event": "shrunk", "world": 1, "samples": 90, "first_step_at": 130.25},
            {"t": 153.0, "event": "start", "world": 2, "samples": 100, "first_step_at": 152.0},
            # The grow at 190 got its first step after t_end: left out.
            {"t": 205.0, "event": "grown", "world": 3, "samples": 400, "first_step_at": 204.0},
        ]
    }
    got = run_figures(events, reports, T0, T_END, BATCH).rescale_s
    assert got == {"grow_in_place": [1.5], "shrink_in_place": [0.25], "handover": [2.0]}
