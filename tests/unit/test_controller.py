"""The decision core (pure): whole fragment lifecycles driven through ``Controller.handle``
with a fake clock and no processes. Real GLPK solves at each decision."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from parsl_bf.allocation import AllocatorSettings
from parsl_bf.executor import controller as core
from parsl_bf.executor.controller import (
    NOTICE_MARGIN,
    NOTICE_SLACK_S,
    ElasticTask,
    PlainTask,
)
from parsl_bf.executor.lifecycle import (
    BOOKKEEPING,
    LAUNCH_FAILED,
    AppCrashed,
    Evaluated,
    Fail,
    FragmentOver,
    FragmentReady,
    FragmentStarted,
    GrowFragment,
    LaunchFailed,
    MarkLost,
    Note,
    Outlook,
    PilotGone,
    PilotLeaving,
    PilotUp,
    ProcessExited,
    Progress,
    RankGroup,
    Rescaled,
    Resolve,
    RunPlain,
    ShrinkFragment,
    Signal,
    StartFragment,
    TaskSubmitted,
    Tick,
    WriteStatus,
    fragment_key,
    plain_key,
)

NOW = 1000.0


class Controller(core.Controller):
    """The controller, its bookkeeping for the shell (:data:`BOOKKEEPING`) left out of what
    ``handle`` returns: these tests check the decisions (the bookkeeping's own tests use
    :class:`core.Controller`)."""

    def handle(self, events, now):
        return [c for c in super().handle(events, now) if not isinstance(c, BOOKKEEPING)]


#: The settings these tests take unless told: no resize in place (a rescale is a hand-over).
_SETTINGS = {"shrink_in_place": False, "grow_in_place": False}


def _controller(tfwd: float = 60, **kw) -> Controller:
    keys = ("time_limit", "objective", "shrink_in_place", "grow_in_place")
    settings = _SETTINGS | {k: kw.pop(k) for k in keys if k in kw}
    return Controller(allocator=AllocatorSettings(tfwd=tfwd, **settings), **kw)


def _nodes(start: StartFragment) -> list[str]:
    return [f"{p}/{h}" for p, hosts in start.placement for h in hosts]


def _task(tid: str, lo: int = 1, hi: int = 4, work: int = 10_000) -> ElasticTask:
    return ElasticTask(tid, work=work, min_nodes=lo, max_nodes=hi, task="m:f")


def _up(pilot: str, *hosts: str, ends_at: float | None = None) -> PilotUp:
    return PilotUp(pilot, hosts, ends_at)


def _of(kind, commands):
    return [c for c in commands if isinstance(c, kind)]


def _notes(commands) -> list[str]:
    return [c.event for c in _of(Note, commands)]


def _exits(start: StartFragment, result: dict | None, code: int = 0) -> list[ProcessExited]:
    """Every launcher of a fragment exits, leaving ``result``."""
    return [
        ProcessExited(pilot, fragment_key(start.task, start.generation, g), code, result)
        for g, (pilot, _) in enumerate(start.placement)
    ]


def _terms(commands) -> set[tuple[str, str]]:
    return {(s.pilot, s.key) for s in _of(Signal, commands) if s.signal == "TERM"}


def test_pilot_up_starts_fragments_within_their_bounds() -> None:
    c = _controller()
    assert c.handle([TaskSubmitted(_task("a", 1, 3))], NOW) == []  # no nodes yet
    out = c.handle([TaskSubmitted(_task("b", 2, 4)), _up("p1", *"12345")], NOW)
    starts = {s.task: _nodes(s) for s in _of(StartFragment, out)}
    assert set(starts) == {"a", "b"}
    assert 1 <= len(starts["a"]) <= 3 and 2 <= len(starts["b"]) <= 4
    assert not set(starts["a"]) & set(starts["b"])
    assert len(starts["a"]) + len(starts["b"]) == 5  # linear guesses: every node is worth it
    assert c.outstanding_nodes() == 7


def test_one_solve_per_batch_however_many_events() -> None:
    c = _controller()
    events = [TaskSubmitted(_task(f"t{i}", 1, 2)) for i in range(5)]
    events += [_up(f"p{i}", "a", "b") for i in range(20)]
    out = c.handle(events, NOW)
    assert c.solves == 1 and len(_of(StartFragment, out)) == 5
    # Reports, evaluations and ticks change no allocation: no solve.
    c.handle([Progress("t0", 2, 100.0, 50), Tick()], NOW + 1)
    assert c.solves == 1
    # A pilot lost with every fragment on it: one solve, not one per event it causes.
    (on_p0,) = [s for s in _of(StartFragment, out) if s.placement[0][0] == "p0"]
    c.handle([PilotGone("p0", "missed heartbeats")], NOW + 2)
    assert c.solves == 2
    assert c.elastic[on_p0.task].state in ("running", "queued")


def test_preemption_stops_the_fragment_and_it_restarts_on_what_is_left() -> None:
    c = _controller(warm_rescale=False)
    (start,) = c.handle([TaskSubmitted(_task("a", 1, 4)), _up("p1", "n1", "n2")], NOW)
    out = c.handle([_up("p2", "n3")], NOW)  # a cold grow: stop first, restart after
    assert _terms(out) == {("p1", fragment_key("a", 1, 0))} and c.elastic["a"].state == "stopping"
    (restart,) = _of(
        StartFragment, c.handle(_exits(start, {"status": "stopped", "samples": 500}), NOW + 1)
    )
    assert len(_nodes(restart)) == 3 and c.elastic["a"].samples == 500
    assert len(restart.placement) == 2  # one launcher per pilot
    # p2 is preempted: every launcher of the fragment spanning it is told to checkpoint.
    out = c.handle([PilotLeaving("p2", "preempted")], NOW + 2)
    assert _terms(out) == {("p1", fragment_key("a", 2, 0)), ("p2", fragment_key("a", 2, 1))}
    assert c.preemptions == 1 and "fragment_stop" in _notes(out)
    out = c.handle(
        [PilotGone("p2", "bye")] + _exits(restart, {"status": "stopped", "samples": 900})[:1],
        NOW + 3,
    )
    (again,) = _of(StartFragment, out)
    assert sorted(_nodes(again)) == ["p1/n1", "p1/n2"] and c.elastic["a"].samples == 900
    # A stale report of an older fragment changes nothing.
    assert c.handle(_exits(start, {"status": "done", "samples": 10_000}), NOW + 5) == []
    assert c.elastic["a"].state == "running"


def test_a_warm_rescale_hands_over_when_the_successor_is_ready() -> None:
    c = _controller()
    (first,) = c.handle([TaskSubmitted(_task("a", 1, 4)), _up("p1", "n1", "n2")], NOW)
    out = c.handle([_up("p2", "n3")], NOW)
    (succ,) = _of(StartFragment, out)
    groups = (RankGroup("p1", ("n1", "n2"), 0, 2, 1), RankGroup("p2", ("n3",), 2, 1, 1))
    assert succ == StartFragment("a", 2, groups, after=1)
    assert not _of(Signal, out)  # the old fragment trains on until its successor is ready
    assert c.handle([_up("p3", "n4")], NOW + 1) == []  # no rescale during a hand-over
    out = c.handle([FragmentReady("a", 2)], NOW + 2)
    assert _terms(out) == {("p1", fragment_key("a", 1, 0))}
    out = c.handle(_exits(first, {"status": "stopped", "samples": 500}), NOW + 3)
    assert "fragment_stopped" in _notes(out)
    # Generation 1's nodes are free: the grow onto p3 may happen, another warm hand-over.
    (grow,) = _of(StartFragment, out)
    assert grow.after == 2 and len(_nodes(grow)) == 4 and c.elastic["a"].previous[0] == 2


def test_a_late_successor_does_not_keep_the_old_fragment_forever() -> None:
    c = _controller(handover_timeout_s=100)
    c.handle([TaskSubmitted(_task("a", 1, 4)), _up("p1", "n1")], NOW)
    c.handle([_up("p2", "n2")], NOW)  # generation 2 waits for generation 1
    assert not _of(Signal, c.handle([Tick()], NOW + 50))
    out = c.handle([Tick()], NOW + 101)
    assert _terms(out) == {("p1", fragment_key("a", 1, 0))}


def test_preemption_during_a_hand_over_stops_both_fragments() -> None:
    c = _controller()
    (first,) = c.handle([TaskSubmitted(_task("a", 1, 4)), _up("p1", "n1", "n2")], NOW)
    (succ,) = _of(StartFragment, c.handle([_up("p2", "n3")], NOW))
    out = c.handle([PilotLeaving("p2", "preempted")], NOW + 1)
    assert _terms(out) == {
        ("p1", fragment_key("a", 1, 0)),
        ("p1", fragment_key("a", 2, 0)),
        ("p2", fragment_key("a", 2, 1)),
    }
    # The successor, preempted in standby, ends first: the task waits for generation 1.
    out = c.handle(_exits(succ, {"status": "stopped", "samples": 0}), NOW + 2)
    assert not _of(StartFragment, out) and c.elastic["a"].state == "stopping"
    (again,) = _of(
        StartFragment, c.handle(_exits(first, {"status": "stopped", "samples": 900}), NOW + 3)
    )
    assert again.after is None and sorted(_nodes(again)) == ["p1/n1", "p1/n2"]
    assert c.elastic["a"].samples == 900


def test_a_successor_that_ends_first_stops_its_predecessor() -> None:
    c = _controller()
    (first,) = c.handle([TaskSubmitted(_task("a", 1, 4)), _up("p1", "n1")], NOW)
    (succ,) = _of(StartFragment, c.handle([_up("p2", "n2")], NOW))
    # The successor's launcher on p2 dies by itself before it is ready.
    out = c.handle([ProcessExited("p2", fragment_key("a", 2, 1), -9, None)], NOW + 1)
    assert ("p1", fragment_key("a", 2, 0)) in _terms(out)  # its other launcher stops
    out = c.handle([ProcessExited("p1", fragment_key("a", 2, 0), -15, None)], NOW + 2)
    # Not a failure of the task: it never trained; its predecessor must stop before a restart.
    assert not _of(Fail, out) and ("p1", fragment_key("a", 1, 0)) in _terms(out)
    assert "successor ended" in [n.fields.get("reason") for n in _of(Note, out)]
    (restart,) = _of(
        StartFragment, c.handle(_exits(first, {"status": "stopped", "samples": 300}), NOW + 3)
    )
    assert restart.generation == 3 and restart.after is None


def test_a_superseded_fragment_that_dies_is_marked_lost() -> None:
    c = _controller()
    (first,) = c.handle([TaskSubmitted(_task("a", 1, 4)), _up("p1", "n1")], NOW)
    c.handle([_up("p2", "n2")], NOW)
    out = c.handle(_exits(first, None, code=-9), NOW + 1)
    # Its successor waits for its result: a "lost" one lets it take over from the checkpoint.
    assert MarkLost("a", 1) in out and "fragment_lost" in _notes(out) and not _of(Fail, out)


def test_a_predecessor_that_finishes_during_a_hand_over_completes_the_task() -> None:
    c = _controller()
    (first,) = c.handle([TaskSubmitted(_task("a", 1, 4, work=1000)), _up("p1", "n1", "n2")], NOW)
    (succ,) = _of(StartFragment, c.handle([_up("p2", "n3")], NOW))
    done = {"status": "done", "samples": 1000}
    out = c.handle(_exits(first, done), NOW + 1)
    (resolve,) = _of(Resolve, out)
    assert resolve.value["samples"] == 1000 and resolve.value["status"] == "done"
    # The successor finds the final checkpoint and ends done too: resolved once only.
    out = c.handle(_exits(succ, done), NOW + 2)
    assert not _of(Resolve, out)
    assert c.elastic["a"].state == "done" and c.outstanding_nodes() == 0


@pytest.mark.parametrize("end", ["pilot gone", "crash"])
def test_a_fragment_that_trained_all_the_work_but_left_no_result_runs_again(end: str) -> None:
    # Its last step report says the work is done, then it ends without a result: its pilot
    # went (a preemption's grace ran out) or a rank crashed before the result was written. The
    # task is not done until a fragment returns its result: a successor starts from the
    # checkpoint and ends at once (or trains what the checkpoint lacks).
    c = _controller()
    (start,) = c.handle([TaskSubmitted(_task("a", 1, 4, work=1000)), _up("p1", "n1")], NOW)
    c.handle([Progress("a", 1, 100.0, 1000)], NOW + 1)
    if end == "pilot gone":
        out = c.handle([PilotGone("p1", "bye")], NOW + 2)
    else:
        out = c.handle(_exits(start, None, code=9), NOW + 2)
    assert not _of(Resolve, out) and c.elastic["a"].state != "done"
    assert c.outstanding_nodes() > 0  # the scaling loop still asks for a pilot
    starts = _of(StartFragment, out + c.handle([_up("p2", "m1")], NOW + 3))
    (again,) = starts
    out = c.handle(_exits(again, {"status": "done", "samples": 1000}), NOW + 4)
    (resolve,) = _of(Resolve, out)
    assert resolve.value["samples"] == 1000 and c.elastic["a"].state == "done"


def test_a_lost_pilot_is_not_a_failure_and_its_plain_tasks_run_again() -> None:
    c = _controller()
    out = c.handle(
        [TaskSubmitted(_task("a", 1, 4)), TaskSubmitted(PlainTask("x")), _up("p1", "n1", "n2")], NOW
    )
    (plain,) = _of(RunPlain, out)
    (start,) = _of(StartFragment, out)
    assert f"{plain.pilot}/{plain.host}" not in _nodes(start)
    # The pilot vanishes without a word (missed heartbeats): no exit will ever be reported.
    out = c.handle([PilotGone("p1", "missed heartbeats")], NOW + 1)
    assert not _of(Fail, out) and not _of(Signal, out)  # nothing left to signal there
    assert c.elastic["a"].state == "queued" and c.plain["x"].state == "queued"
    assert "task_requeued" in _notes(out) and not c.fragments
    # A late exit report from the gone pilot changes nothing.
    assert c.handle([ProcessExited("p1", plain_key("x"), -9, None)], NOW + 2) == []
    out = c.handle([_up("p2", "m1")], NOW + 3)  # plain first: the elastic task waits
    assert out == [RunPlain("x", "p2", "m1")]
    out = c.handle([ProcessExited("p2", plain_key("x"), 0, (True, 42))], NOW + 4)
    assert Resolve("x", 42) in out and _of(StartFragment, out)


def test_a_crashed_rank_restarts_from_the_checkpoint_a_bounded_number_of_times() -> None:
    c = _controller(max_restarts=2)
    (start,) = c.handle([TaskSubmitted(_task("a", 1, 4, work=5000)), _up("p1", "n1")], NOW)
    for attempt in (1, 2):
        c.handle([Progress("a", 1, 100.0, 1000 * attempt + 400)], NOW + attempt)
        # A rank SIGKILLed: mpiexec ends with the signal, no result. Not the task's fault.
        out = c.handle(_exits(start, None, code=9), NOW + attempt)
        assert not _of(Fail, out) and "fragment_failed" in _notes(out)
        (start,) = _of(StartFragment, out)  # again at once, from the task's checkpoint
        c.handle([FragmentStarted("a", 1000 * attempt)], NOW + attempt)  # resumed there
    assert c.elastic["a"].restarts == 2 and c.elastic["a"].redone_samples == 800
    out = c.handle(_exits(start, {"status": "done", "samples": 5000}), NOW + 5)
    (resolve,) = _of(Resolve, out)
    assert resolve.value["restarts"] == 2 and resolve.value["redone_samples"] == 800


def test_crashes_beyond_max_restarts_fail_the_task_once() -> None:
    c = _controller(max_restarts=1)
    (start,) = c.handle([TaskSubmitted(_task("a", 1, 4)), _up("p1", "n1")], NOW)
    (start,) = _of(StartFragment, c.handle(_exits(start, None, code=9), NOW + 1))
    out = c.handle(_exits(start, None, code=9), NOW + 2)
    (fail,) = _of(Fail, out)
    assert fail.task == "a" and fail.generation == 2 and "after 1 restarts" in fail.error
    assert c.elastic["a"].state == "failed" and c.outstanding_nodes() == 0
    assert not _of(StartFragment, c.handle([_up("p2", "n2")], NOW + 3))


def test_a_launch_whose_ranks_never_train_is_stopped_restarted_then_failed() -> None:
    """A start that never reports a step (job steps that never get their CPUs) is stopped
    at its deadline, counted as a restart, and the last one fails the task naming where it
    ran; a start that reports in time is left alone."""
    c = _controller(max_restarts=1, start_timeout_s=30)
    (start,) = c.handle([TaskSubmitted(_task("a", 2, 2)), _up("p1", "n1", "n2")], NOW)
    assert not _terms(c.handle([Tick()], NOW + 29))  # not yet late
    out = c.handle([Tick()], NOW + 31)
    assert "fragment_start_timeout" in _notes(out)
    assert _terms(out) == {("p1", fragment_key("a", 1, 0))}
    # Its launcher, told to stop while it waited, exits: a failed start, tried again.
    out = c.handle(_exits(start, None, code=-15), NOW + 32)
    assert not _of(Fail, out) and "fragment_failed" in _notes(out)
    (again,) = _of(StartFragment, out)
    assert c.elastic["a"].restarts == 1
    out = c.handle([Tick()], NOW + 32 + 31)
    assert _terms(out) == {("p1", fragment_key("a", 2, 0))}
    (fail,) = _of(Fail, c.handle(_exits(again, None, code=-15), NOW + 64))
    assert "had not started training" in fail.error and "pilot p1 hosts n1,n2" in fail.error
    assert "after 1 restarts" in fail.error and c.elastic["a"].state == "failed"
    # A start that trains before its deadline is never stopped for it.
    c = _controller(start_timeout_s=30)
    c.handle([TaskSubmitted(_task("b", 1, 1)), _up("p1", "n1")], NOW)
    c.handle([FragmentStarted("b", 0)], NOW + 5)
    assert not _terms(c.handle([Tick()], NOW + 1000))


def test_an_exception_in_the_tasks_own_code_fails_at_once_with_its_traceback() -> None:
    c = _controller(max_restarts=5)
    (start,) = c.handle([TaskSubmitted(_task("a")), _up("p1", "n1")], NOW)
    error = "Traceback (most recent call last):\n  ...\nZeroDivisionError: division by zero"
    out = c.handle(_exits(start, {"status": "error", "samples": 0, "error": error}, 1), NOW + 1)
    (fail,) = _of(Fail, out)
    assert fail.error == error and c.elastic["a"].restarts == 0 and not _of(StartFragment, out)


def test_a_rerun_reports_the_samples_it_resumed_from() -> None:
    c = _controller()
    (start,) = c.handle([TaskSubmitted(_task("a", work=3000)), _up("p1", "n1")], NOW)
    c.handle([FragmentStarted("a", 2000)], NOW + 1)  # a checkpoint of an earlier run
    out = c.handle(_exits(start, {"status": "done", "samples": 3000}), NOW + 2)
    (resolve,) = _of(Resolve, out)
    assert resolve.value["resumed_samples"] == 2000 and resolve.value["restarts"] == 0


def test_a_group_that_ends_alone_stops_the_others_and_a_stuck_one_is_killed() -> None:
    c = _controller(stop_grace_s=30)
    c.handle([TaskSubmitted(_task("a", 2, 2))], NOW)
    (start,) = c.handle([_up("p1", "n1"), _up("p2", "n2")], NOW)
    out = c.handle([ProcessExited("p1", fragment_key("a", 1, 0), 0, None)], NOW + 1)
    assert _terms(out) == {("p2", fragment_key("a", 1, 1))}
    assert not _of(Signal, c.handle([Tick()], NOW + 20))
    out = c.handle([Tick()], NOW + 32)  # blocked on its dead peer: killed
    assert [(s.pilot, s.signal) for s in _of(Signal, out)] == [("p2", "KILL")]


def test_a_start_that_cannot_be_launched_fails_the_task_after_max_restarts() -> None:
    # The shell could not launch group 0 (its files: a full disk) and KILLed group 1, which it
    # had sent: the exits it reports. The stop of group 1 that the first exit causes does not
    # make the end a clean stop, which would start the fragment again forever.
    c = _controller(max_restarts=2)
    c.handle([TaskSubmitted(_task("a", 2, 2))], NOW)
    (start,) = c.handle([_up("p1", "n1"), _up("p2", "n2")], NOW)
    for attempt in (1, 2, 3):
        first, second = (
            fragment_key("a", start.generation, g) for g in range(len(start.placement))
        )
        out = c.handle([LaunchFailed("p1", first, OSError(28, "full"))], NOW + attempt)
        assert _terms(out) == {("p2", second)} and not _of(StartFragment, out)
        out = c.handle([ProcessExited("p2", second, -9, None)], NOW + attempt)
        if attempt <= 2:
            assert "fragment_failed" in _notes(out) and not _of(Fail, out)
            assert c.elastic["a"].restarts == attempt
            (start,) = _of(StartFragment, out)  # again from the checkpoint
    (fail,) = _of(Fail, out)
    assert fail.generation == 3 and f"exit {LAUNCH_FAILED} after 2 restarts" in fail.error
    assert c.elastic["a"].state == "failed" and not _of(StartFragment, out)
    assert not _of(StartFragment, c.handle([_up("p3", "n3", "n4")], NOW + 9))


def test_a_launch_failed_in_the_agent_counts_as_one_too() -> None:
    # The agent's own report (127: the program was not found): the same classification, in
    # one batch with the other group's exit.
    c = _controller(max_restarts=0)
    c.handle([TaskSubmitted(_task("a", 2, 2))], NOW)
    (start,) = c.handle([_up("p1", "n1"), _up("p2", "n2")], NOW)
    exits = [
        ProcessExited("p2", fragment_key("a", 1, 1), 127, None),
        ProcessExited("p1", fragment_key("a", 1, 0), 0, {"status": "stopped", "samples": 0}),
    ]
    (fail,) = _of(Fail, c.handle(exits, NOW + 1))
    assert fail.task == "a" and c.elastic["a"].state == "failed"


def test_a_stop_of_a_fragment_that_ran_is_still_no_failure() -> None:
    # The same exits without a failed launch (a group that ended alone, then the stopped
    # others): a clean stop, nothing counted.
    c = _controller(max_restarts=0)
    c.handle([TaskSubmitted(_task("a", 2, 2))], NOW)
    c.handle([_up("p1", "n1"), _up("p2", "n2")], NOW)
    exits = [
        ProcessExited("p1", fragment_key("a", 1, 0), 0, None),
        ProcessExited("p2", fragment_key("a", 1, 1), -9, None),
    ]
    out = c.handle(exits, NOW + 1)
    assert not _of(Fail, out) and _of(StartFragment, out) and c.elastic["a"].restarts == 0


def test_a_plain_app_that_could_not_be_launched_fails_with_the_error() -> None:
    # The shell reports a plain app it could not launch with the error as its outcome: the
    # future fails with it, and the app does not run again (Parsl's retries may).
    c = _controller()
    (run,) = c.handle([TaskSubmitted(PlainTask("x")), _up("p1", "n1")], NOW)
    error = OSError(28, "No space left on device", "app.out")
    out = c.handle([LaunchFailed("p1", plain_key("x"), error)], NOW + 1)
    assert Fail("x", error) in out and c.plain["x"].state == "done"
    assert not _of(RunPlain, c.handle([_up("p2", "m1")], NOW + 2))


def test_a_rank_that_crashes_alone_counts_against_max_restarts() -> None:
    # Group 0 exits 1 on a pilot that stays, before anything asked it to stop (a crashed rank):
    # the other group is stopped, and the end is a crash, not a clean stop, though that group
    # says "stopped". Crashing again and again fails the task instead of restarting forever.
    c = _controller(max_restarts=1)
    c.handle([TaskSubmitted(_task("a", 2, 2))], NOW)
    (start,) = c.handle([_up("p1", "n1"), _up("p2", "n2")], NOW)
    for attempt in (1, 2):
        first, second = (
            fragment_key("a", start.generation, g) for g in range(len(start.placement))
        )
        out = c.handle([ProcessExited("p1", first, 1, None)], NOW + attempt)
        assert _terms(out) == {("p2", second)}
        stopped = {"status": "stopped", "samples": 100 * attempt}
        out = c.handle([ProcessExited("p2", second, 0, stopped)], NOW + attempt)
        if attempt == 1:
            assert "fragment_failed" in _notes(out) and c.elastic["a"].restarts == 1
            (start,) = _of(StartFragment, out)  # again from the checkpoint
    (fail,) = _of(Fail, out)
    assert "exit 1 after 1 restarts" in fail.error and c.elastic["a"].state == "failed"


def test_a_group_that_exits_on_a_leaving_pilot_is_no_crash() -> None:
    # The ranks on a preempted pilot killed at the end of its grace time: not the task's fault.
    c = _controller(max_restarts=0)
    c.handle([TaskSubmitted(_task("a", 2, 2))], NOW)
    (start,) = c.handle([_up("p1", "n1"), _up("p2", "n2")], NOW)
    c.handle([PilotLeaving("p1", "preempted")], NOW + 1)
    exits = [ProcessExited(p, fragment_key("a", 1, g), -9, None)
             for g, (p, _) in enumerate(start.placement)]  # fmt: skip
    out = c.handle(exits, NOW + 2)
    assert not _of(Fail, out) and c.elastic["a"].restarts == 0


def test_a_plain_app_that_keeps_dying_on_live_pilots_fails() -> None:
    # Killed with no outcome on a pilot that stays (the kernel's OOM killer, a crash of the
    # interpreter): run again max_restarts times, then its future fails. A pilot that leaves
    # does not count.
    c = _controller(max_restarts=2)
    c.handle([TaskSubmitted(PlainTask("x")), _up("p1", "n1")], NOW)
    c.handle([PilotLeaving("p1", "preempted")], NOW + 1)
    out = c.handle([ProcessExited("p1", plain_key("x"), -15, None)], NOW + 2)
    assert "task_requeued" in _notes(out) and c.plain["x"].crashes == 0
    (run,) = _of(RunPlain, c.handle([_up("p2", "m1")], NOW + 3))
    for attempt in (1, 2, 3):
        out = c.handle([ProcessExited("p2", plain_key("x"), -9, None)], NOW + 3 + attempt)
        if attempt <= 2:
            assert "task_requeued" in _notes(out) and _of(RunPlain, out)
    (fail,) = _of(Fail, out)
    assert isinstance(fail.error, AppCrashed) and "exit -9 without an outcome" in str(fail.error)
    assert c.plain["x"].state == "done" and c.plain["x"].crashes == 3


def test_a_pilot_near_its_walltime_is_leaving() -> None:
    c = _controller(walltime_notice_s=5, min_node_life_s=0)
    (start,) = c.handle([TaskSubmitted(_task("a")), _up("p1", "n1", ends_at=NOW + 30)], NOW)
    assert not _of(Signal, c.handle([Tick()], NOW + 20))
    out = c.handle([Tick()], NOW + 26)
    assert "pilot_ending" in _notes(out) and _terms(out) == {("p1", fragment_key("a", 1, 0))}
    assert c.pilots["p1"].leaving and c.preemptions == 0


def test_the_walltime_notice_follows_the_tasks_own_stops() -> None:
    c = _controller(walltime_notice_s=5, min_node_life_s=0)
    (start,) = c.handle([TaskSubmitted(_task("a", 1, 1)), _up("p1", "n1", ends_at=NOW + 30)], NOW)
    # The task has not stopped yet: the configured notice.
    assert c.notices() == {"p1": 5} and c.next_deadline() == NOW + 25
    assert _terms(c.handle([Tick()], NOW + 25)) == {("p1", fragment_key("a", 1, 0))}
    assert c.next_deadline() is None  # p1 is leaving
    c.handle(_exits(start, {"status": "stopped", "samples": 500}), NOW + 25.4)  # took 0.4 s
    c.handle([PilotGone("p1", "bye")], NOW + 30)
    (again,) = _of(StartFragment, c.handle([_up("p2", "n2", ends_at=NOW + 90)], NOW + 60))
    notice = NOTICE_MARGIN * 0.4 + NOTICE_SLACK_S
    assert c.notices()["p2"] == pytest.approx(notice)
    assert c.next_deadline() == pytest.approx(NOW + 90 - notice)
    assert not _of(Signal, c.handle([Tick()], NOW + 90 - notice - 0.01))
    out = c.handle([Tick()], NOW + 90 - notice + 1e-6)
    assert _terms(out) == {("p2", fragment_key("a", 2, 0))}
    # A slow stop raises it, never above walltime_notice_s.
    c.handle(_exits(again, {"status": "stopped", "samples": 900}), NOW + 90 - notice + 9)
    c.handle([_up("p3", "n3", ends_at=NOW + 200)], NOW + 100)
    assert c.notices()["p3"] == 5


def test_a_task_that_has_not_stopped_yet_takes_its_familys_notice() -> None:
    c = _controller(walltime_notice_s=5, min_node_life_s=0)
    first = ElasticTask("a", work=10**9, max_nodes=1, task="m:f", family="m:f")
    (start,) = c.handle([TaskSubmitted(first), _up("p1", "n1", ends_at=NOW + 30)], NOW)
    c.handle([Tick()], NOW + 25)
    c.handle(_exits(start, {"status": "stopped", "samples": 500}), NOW + 25.4)
    c.handle([PilotGone("p1", "bye")], NOW + 30)
    # a has its node again; b (same code) and c (other code) have not stopped yet.
    b = ElasticTask("b", work=10**9, max_nodes=1, task="m:f", family="m:f")
    other = ElasticTask("c", work=10**9, max_nodes=1, task="m:g", family="m:g")
    ups = [_up(f"q{i}", f"m{i}", ends_at=NOW + 90) for i in range(3)]
    starts = _of(StartFragment, c.handle([TaskSubmitted(b), TaskSubmitted(other), *ups], NOW + 31))
    on = {s.task: s.placement[0][0] for s in starts}
    notices = c.notices()
    assert (
        notices[on["a"]] == notices[on["b"]] == pytest.approx(NOTICE_MARGIN * 0.4 + NOTICE_SLACK_S)
    )
    assert notices[on["c"]] == 5


def test_a_node_about_to_leave_is_not_worth_a_rescale() -> None:
    c = _controller(min_node_life_s=40)
    c.handle([TaskSubmitted(_task("a", 1, 4))], NOW)
    assert c.handle([_up("short", "n1", "n2", ends_at=NOW + 30)], NOW) == []
    (start,) = c.handle([_up("long", "n3", ends_at=NOW + 3600)], NOW)
    assert _nodes(start) == ["long/n3"]
    paper = _controller(min_node_life_s=0)
    paper.handle([TaskSubmitted(_task("a", 1, 4))], NOW)
    (start,) = paper.handle([_up("short", "n1", "n2", ends_at=NOW + 30)], NOW)
    assert len(_nodes(start)) == 2


def test_the_policy_object_is_the_replays() -> None:
    # The executor's decisions go through the same policy object as parsl-bf replay's.
    c = Controller(allocator=AllocatorSettings(policy="equal-share", tfwd=60, **_SETTINGS))
    out = c.handle(
        [TaskSubmitted(_task("a", 1, 4)), TaskSubmitted(_task("b", 1, 4)), _up("p", *"1234")], NOW
    )
    assert sorted(s.nodes for s in _of(StartFragment, out)) == [2, 2]
    auto = Controller(allocator=AllocatorSettings(tfwd="auto", **_SETTINGS))
    auto.handle([_up("p", "n", ends_at=NOW + 300), _up("q", "n", ends_at=NOW + 500)], NOW)
    assert auto.effective_tfwd == 400


def test_measured_rates_replace_the_guess() -> None:
    t = ElasticTask("a", work=1000, max_nodes=3, scaling={1: 10.0, 2: 20.0, 3: 30.0})
    assert t.curve() == ((0, 1, 2, 3), (0.0, 10.0, 20.0, 30.0))
    for rate in (50.0, 52.0, 48.0):
        t.measured.setdefault(2, []).append(rate)
    nodes, rates = t.curve()
    assert rates[2] == 50.0 and rates[3] == 50.0  # measured 2; the guess 30 < 50 is lifted
    assert ElasticTask("b", work=1, max_nodes=2).curve()[1] == (0.0, 1.0, 2.0)


def test_an_unmeasured_task_borrows_its_familys_rates() -> None:
    # Without them it would be worth 1 sample/s per node and wait while measured tasks grow
    # (under an objective that counts samples; speedup and its kin count P(n) / P(1)).
    c = _controller(objective="throughput")
    old = ElasticTask("old", work=10**9, max_nodes=2, task="m:f", family="m:f")
    c.handle([TaskSubmitted(old), _up("p1", "n1")], NOW)
    c.handle([Progress("old", 1, 500.0, 5000)], NOW)
    new = ElasticTask("new", work=10**9, max_nodes=2, task="m:f", family="m:f")
    other = ElasticTask("other", work=10**9, max_nodes=2, task="m:g", family="m:g")
    c.handle([TaskSubmitted(new), TaskSubmitted(other)], NOW + 1)
    assert new.curve(c._family_rates().get(new.family))[1] == (0.0, 500.0, 1000.0)
    assert other.curve(c._family_rates().get(other.family))[1] == (0.0, 1.0, 2.0)  # another family
    # The free node goes to the new task, not to growing the measured one (rescale cost).
    (start,) = c.handle([_up("p2", "n2")], NOW + 2)
    assert start.task == "new"
    # A guess of its own is not overridden by the family's measurements.
    guessed = ElasticTask("g", work=1, max_nodes=1, task="m:f", family="m:f", scaling={1: 7.0})
    c.handle([TaskSubmitted(guessed)], NOW + 3)
    assert guessed.curve(c._family_rates().get(guessed.family))[1] == (0.0, 7.0)


def test_the_runs_accounting() -> None:
    c = _controller()
    c.handle([TaskSubmitted(_task("a", 1, 1))], NOW)
    c.handle([_up("p1", "n1", "n2")], NOW)  # the task takes one of the two nodes
    # First step at 200 samples, then 200 samples at 200/s twice and 200 at 50/s: 600 in 6 s,
    # 100 samples/s over the run (the median of the reports, 200, would count half as much).
    c.handle([FragmentStarted("a", 200)], NOW + 4)
    c.handle([Progress("a", 1, 200.0, 400)], NOW + 5)
    c.handle([Progress("a", 1, 200.0, 600)], NOW + 6)
    c.handle([Progress("a", 1, 50.0, 800)], NOW + 10)
    acc = c.efficiency()
    assert (acc["offered_node_s"], acc["used_node_s"]) == (20.0, 10.0)
    assert acc["util"] == 0.5 and acc["E_used"] == 0.8 and acc["E_avail"] == 0.4
    assert "suspect" not in acc
    c.handle([PilotLeaving("p1", "preempted")], NOW + 10)  # a leaving pilot offers nothing
    c.account(NOW + 20)
    assert c.efficiency()["offered_node_s"] == 20.0


def test_an_efficiency_above_one_is_marked_not_a_result() -> None:
    # One node trained at 10 samples/s, then two at 100 each: where nodes share cores, the
    # load moves the rates, and 1,000 samples in 12 node-seconds count as 100 at one node.
    c = _controller()
    c.handle([TaskSubmitted(_task("a", 1, 2))], NOW)
    c.handle([_up("p1", "n1")], NOW)
    c.handle([FragmentStarted("a", 10)], NOW + 1)
    c.handle([Progress("a", 1, 10.0, 100)], NOW + 10)
    c.handle([Rescaled("a", 0.5, in_place="grow")], NOW + 10)
    c.handle([Progress("a", 2, 200.0, 1000)], NOW + 12)
    acc = c.efficiency()
    assert acc["E_used"] > 1.02 and "E_used" in acc["suspect"] and "noise" not in acc
    # Above 1 by less than E_SLACK: the same noise, marked to be read as 1 (the node-seconds
    # set as if every offered one had been used for 1,000 samples / 1.01).
    c.used_node_s = c.offered_node_s = acc["E_used"] * acc["used_node_s"] / 1.01
    c.used_capacity_s = c.offered_capacity_s = c.used_node_s  # real nodes: the same
    acc = c.efficiency()
    assert acc["util"] == 1 and acc["E_used"] == acc["E_avail"] == pytest.approx(1.01)
    assert "suspect" not in acc
    assert acc["noise"].startswith("E_used, E_avail above 1 by at most 0.02")


def test_emulated_nodes_count_at_their_share_of_the_cores() -> None:
    # Task a trains at one node at 100/s with a core of its own, then at 50/s while its rank
    # gets half a core (other emulated nodes share it): the same node's work. Task b, never
    # at one node, has no P(1): its samples and node-seconds are both left out.
    def run(shared_cores: int | None) -> dict:
        c = _controller(shared_cores=shared_cores)
        c.handle([TaskSubmitted(_task("a", 1, 1)), TaskSubmitted(_task("b", 3, 3))], NOW)
        c.handle([_up("p1", "n1")], NOW)
        c.handle([FragmentStarted("a", 0)], NOW + 1)
        c.handle([Progress("a", 1, 100.0, 1000, cpu_share=1.0)], NOW + 11)
        c.handle([_up("p2", "n2", "n3", "n4")], NOW + 11)  # b takes these three
        c.handle([FragmentStarted("b", 10)], NOW + 11)
        c.handle([Progress("b", 3, 30.0, 310, cpu_share=0.5)], NOW + 21)
        c.handle([Progress("a", 1, 50.0, 1500, cpu_share=0.5)], NOW + 21)
        return c.efficiency()

    emulated = run(2)
    assert emulated["unmeasured_node_s"] == 30.0  # b: 3 nodes, 10 s
    # P(1) = 1,500 samples / (10 + 10 × 0.5) s = 100/s; a node's mean share: (10 × 1 + 10 × 0.5
    # + 30 × 0.5) / 50 = 0.6. a held its node 21 s: 10 s at a whole core, 10 at half, and the
    # second before its first step at the mean share.
    assert emulated["node_capacity"] == pytest.approx(0.6)
    assert emulated["E_used"] == pytest.approx(1500 / 100 / (10 + 10 * 0.5 + 1 * 0.6))
    assert "2 cores" in emulated["p1"]
    # Real nodes: the shares are not read; P(1) is 1,500 samples in 20 s.
    real = run(None)
    assert real["node_capacity"] == 1 and real["E_used"] == pytest.approx(1500 / 75 / 21)
    assert real["util"] == emulated["util"]


def test_a_node_about_to_leave_is_not_moved_to_another_task() -> None:
    c = _controller(min_node_life_s=40)
    slow = ElasticTask("slow", work=10**6, task="m:f", scaling={1: 10.0})
    (start,) = c.handle([TaskSubmitted(slow), _up("p", "n1", ends_at=NOW + 100)], NOW)
    assert start.task == "slow"
    # 30 s before the pilot ends, a much faster task arrives: taking the node from `slow`
    # would stop it and leave the node idle (not worth starting on), so nothing moves.
    fast = ElasticTask("fast", work=10**6, task="m:f", scaling={1: 1000.0})
    assert c.handle([TaskSubmitted(fast)], NOW + 70) == []
    assert (slow.state, fast.state) == ("running", "queued")


# --- invariants over random lifecycles ---------------------------------------------------------

events = st.lists(
    st.one_of(
        st.tuples(st.just("up"), st.integers(1, 3), st.sampled_from([None, 20.0, 500.0])),
        st.tuples(st.just("leave"), st.integers(0, 5)),
        st.tuples(st.just("gone"), st.integers(0, 5)),
        st.tuples(st.just("elastic"), st.integers(1, 2), st.integers(1, 3)),
        st.tuples(st.just("plain")),
        st.tuples(st.just("exit"), st.integers(0, 7), st.sampled_from(["stopped", "done", None])),
        st.tuples(st.just("ready"), st.integers(0, 5)),
        st.tuples(st.just("grown"), st.integers(0, 5)),
        st.tuples(st.just("tick"), st.integers(1, 200)),
        st.tuples(st.just("all_done"), st.integers(0, 5)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events, st.integers(1, 3), st.booleans())
# Found by the earlier form of this test: a task started on a node another was giving back.
@example(
    [
        ("up", 2, None),
        ("elastic", 1, 2),
        ("plain",),
        ("plain",),
        ("up", 3, None),
        ("elastic", 2, 1),
    ],
    1,
    False,
)
# Found by this test: a predecessor that finished the work during a hand-over resolved the
# task, and its stopped successor then queued it to train again.
@example(
    [("up", 1, None), ("up", 1, None), ("elastic", 1, 3), ("up", 1, None), ("gone", 0)]
    + [("exit", 0, "done")],
    1,
    False,
)
# Found by this test: a TERM to a pilot the same batch reported gone, or to a process the
# same batch reported exited.
@example([("up", 1, None), ("elastic", 1, 1), ("leave", 0), ("gone", 0)], 2, False)
@example(
    [("up", 1, 20.0), ("up", 1, None), ("elastic", 1, 1), ("leave", 1), ("exit", 0, "stopped")],
    3,
    False,
)
# In-place grows: a task on one pilot grows onto the next; it grows, or its joiner ends first,
# or the grow is not done in time, or the joiner's pilot goes.
@example(
    [("up", 1, None), ("elastic", 1, 2), ("up", 1, 500.0), ("grown", 0), ("exit", 0, "done")]
    + [("exit", 1, "done")],
    1,
    True,
)
@example(
    [("up", 1, None), ("elastic", 1, 2), ("up", 1, 500.0), ("exit", 1, None)]
    + [("exit", 0, "stopped")],
    1,
    True,
)
@example([("up", 1, None), ("elastic", 1, 2), ("up", 1, 500.0), ("tick", 150)], 1, True)
@example(
    [("up", 1, None), ("elastic", 1, 2), ("up", 1, 500.0), ("gone", 1), ("exit", 0, "stopped")],
    1,
    True,
)
# In-place shrinks: a poorly scaling task on two pilots gives one back to a newcomer; its
# ranks there leave (or the shrink is not done in time).
@example(
    [("up", 1, None), ("up", 1, 500.0), ("elastic", 1, 2), ("elastic", 1, 1)]
    + [("exit", 1, None), ("tick", 1), ("exit", 0, "done")],
    1,
    True,
)
@example(
    [("up", 1, None), ("up", 1, 500.0), ("elastic", 1, 2), ("elastic", 1, 1), ("tick", 150)],
    1,
    True,
)
# Found by this test: a task grew (a hand-over) while its in-place shrink was under way, and
# the end of the grown fragment freed the node whose rank had not yet left.
@example(
    [("up", 1, None), ("up", 1, 500.0), ("up", 1, None), ("elastic", 1, 3), ("up", 1, None)]
    + [("elastic", 2, 1), ("up", 1, None), ("leave", 3), ("gone", 0), ("exit", 2, "stopped")]
    + [("exit", 2, "stopped")],
    2,
    True,
)
# Found by this test (a task that spans a two-host pilot): a fragment's group ended alone, a
# warm successor started while it stopped and was lost with its pilot, then the fragment
# finished the work: the task, resolved, was queued and started again.
@example(
    [("up", 1, None), ("up", 1, 500.0), ("up", 1, None), ("up", 2, None), ("elastic", 1, 3)]
    + [("elastic", 2, 2), ("elastic", 1, 1), ("exit", 0, "stopped"), ("gone", 0)]
    + [("exit", 0, "done")],
    2,
    False,
)
# Found by this test: a predecessor finished the work during a hand-over, and the resolved
# task's successor was then rescaled (a third fragment started).
@example(
    [("up", 1, None), ("up", 1, 500.0), ("up", 1, None), ("up", 2, None), ("elastic", 1, 3)]
    + [("elastic", 2, 2), ("leave", 1), ("exit", 0, "stopped"), ("exit", 0, "stopped")]
    + [("exit", 0, "done")],
    1,
    False,
)
# A fragment whose step reports reached the work, then lost with its pilot or crashed before
# it wrote its result: the task was marked done, and its future was never set.
@example([("up", 1, None), ("elastic", 1, 1), ("all_done", 0), ("gone", 0)], 1, False)
@example([("up", 1, None), ("elastic", 1, 1), ("all_done", 0), ("exit", 0, None)], 1, False)
def test_lifecycle_invariants(seq, batch_size, in_place) -> None:
    """Whatever happens, in batches of any size, with in-place shrinks and grows or not: no
    node runs two tasks (but a fragment and its warm successor), starts and grows are within
    bounds and on pilots not leaving, every signal goes to a live process, each future is set
    at most once, a task whose future is set never starts or grows again, and a task is over
    only once its future is set."""
    c = _controller(
        time_limit=5, min_node_life_s=30, shrink_in_place=in_place, grow_in_place=in_place
    )
    now, n = NOW, 0
    pilots: list[str] = []
    owner: dict[str, set[tuple[str, int]]] = {}  # node → (task, generation) running there
    live: dict[str, str] = {}  # process key → pilot, from the commands alone
    hosts: dict[str, list[str]] = {}  # a fragment's process key → the nodes of its ranks
    leaving: set[str] = set()  # process keys an in-place shrink lets go
    settled: set[str] = set()

    def apply(commands) -> None:
        for cmd in commands:
            if isinstance(cmd, StartFragment):
                assert cmd.task not in settled, f"{cmd.task} started after its future was set"
                task = c.elastic[cmd.task]
                assert task.min_nodes <= cmd.nodes <= task.max_nodes
                for node in _nodes(cmd):
                    there = owner.get(node, set())
                    assert there <= {(cmd.task, cmd.after)}, f"{node}: {cmd.task} and {there}"
                    assert not c.pilots[node.split("/")[0]].leaving
                    owner.setdefault(node, set()).add((cmd.task, cmd.generation))
                for g, (pilot, names) in enumerate(cmd.placement):
                    live[fragment_key(cmd.task, cmd.generation, g)] = pilot
                    hosts[fragment_key(cmd.task, cmd.generation, g)] = [
                        f"{pilot}/{h}" for h in names
                    ]
            elif isinstance(cmd, GrowFragment):
                assert cmd.task not in settled, f"{cmd.task} grew after its future was set"
                task = c.elastic[cmd.task]
                assert len(task.nodes) <= task.max_nodes
                for g, (pilot, names) in enumerate(cmd.placement, start=cmd.first):
                    assert not c.pilots[pilot].leaving
                    key = fragment_key(cmd.task, cmd.generation, g)
                    assert key not in live, f"{key} launched twice"
                    live[key] = pilot
                    hosts[key] = [f"{pilot}/{h}" for h in names]
                    for node in hosts[key]:
                        assert not owner.get(node), f"{node}: {cmd.task} and {owner[node]}"
                        owner.setdefault(node, set()).add((cmd.task, cmd.generation))
            elif isinstance(cmd, ShrinkFragment):
                groups = {k for k in live if k.split("#")[:2] == [cmd.task, str(cmd.generation)]}
                # Some of its live launchers stay, some leave (any of them: at a preemption the
                # first pilot's ranks may be the ones that go); the ranks named are a world's.
                numbers = {int(k.split("#")[2]) for k in groups}
                assert cmd.keep and set(cmd.keep) < numbers, (cmd.keep, numbers)
                assert len(set(cmd.ranks)) == len(cmd.ranks) and max(cmd.ranks) < cmd.of
                leaving.update(
                    k for k in groups if int(k.split("#")[2]) not in cmd.keep
                )  # fmt: skip
            elif isinstance(cmd, RunPlain):
                node = f"{cmd.pilot}/{cmd.host}"
                assert not owner.get(node)
                owner[node] = {(cmd.task, 0)}
                live[plain_key(cmd.task)] = cmd.pilot
            elif isinstance(cmd, Signal):
                assert live.get(cmd.key) == cmd.pilot and cmd.pilot in pilots
            elif isinstance(cmd, Resolve | Fail):
                assert cmd.task not in settled
                settled.add(cmd.task)

    def exited(key: str) -> None:
        live.pop(key, None)
        parts = key.split("#")
        who = (parts[1], 0) if parts[0] == "plain" else (parts[0], int(parts[1]))
        if key in leaving:  # its ranks left a fragment shrunk in place: their nodes are free
            leaving.discard(key)
            for node in hosts.get(key, []):
                owner.get(node, set()).discard(who)
        if not any(k for k in live if k.split("#")[:2] == key.split("#")[:2]):
            for node, there in list(owner.items()):
                there.discard(who)
                if not there:
                    del owner[node]

    batch: list = []
    for ev in seq:
        kind = ev[0]
        if kind == "up":
            n += 1
            pilots.append(f"p{n}")
            ends = None if ev[2] is None else now + ev[2]
            batch.append(PilotUp(f"p{n}", tuple(f"h{i}" for i in range(ev[1])), ends))
        elif kind in ("leave", "gone") and pilots:
            pid = pilots[ev[1] % len(pilots)]
            if kind == "leave":
                batch.append(PilotLeaving(pid, "preempted"))
            else:
                pilots.remove(pid)
                for key in [k for k, p in live.items() if p == pid]:
                    exited(key)  # its processes died with it
                batch.append(PilotGone(pid, "bye"))
        elif kind == "elastic":
            n += 1
            task = _task(f"e{n}", ev[1], ev[1] + ev[2] - 1)
            if n % 2:  # every other task scales poorly: newcomers make the others shrink
                task.scaling = {k: 100.0 * k**0.3 for k in range(1, task.max_nodes + 1)}
            batch.append(TaskSubmitted(task))
        elif kind == "plain":
            n += 1
            batch.append(TaskSubmitted(PlainTask(f"x{n}")))
        elif kind == "exit" and live:
            key = sorted(live)[ev[1] % len(live)]
            pilot = live[key]
            result = None if ev[2] is None else {"status": ev[2], "samples": 0}
            if key.startswith("plain#"):
                result = (True, 1)
            exited(key)
            batch.append(ProcessExited(pilot, key, 0, result))
        elif kind == "ready" and c.handovers:
            task_id, gen = sorted(c.handovers)[ev[1] % len(c.handovers)]
            batch.append(FragmentReady(task_id, gen))
        elif kind == "grown":
            joining = sorted(t for (t, _), f in c.fragments.items() if f.joining)
            if joining:
                batch.append(Rescaled(joining[ev[1] % len(joining)], 0.5, in_place="grow"))
        elif kind == "tick":
            now += ev[1]
            batch.append(Tick())
        elif kind == "all_done":  # a step report that reaches the work: no result yet
            running = sorted(t for t, _ in c.fragments)
            if running:
                task = c.elastic[running[ev[1] % len(running)]]
                batch.append(Progress(task.id, max(1, len(task.nodes)), 100.0, task.work))
        if len(batch) >= batch_size:
            apply(c.handle(batch, now))
            batch = []
    apply(c.handle(batch, now))
    for task in c.elastic.values():
        assert task.state in ("queued", "running", "stopping", "done", "failed")
        if task.id in settled:  # over, or its last fragment still on its way out
            assert task.state in ("done", "failed") or any(t == task.id for t, _ in c.fragments)
        if task.state in ("done", "failed"):  # over only once its future is set
            assert task.id in settled


def test_the_same_nodes_in_another_order_are_no_rescale() -> None:
    """The node plan orders a task's nodes by how long they stay. A task that grew onto a
    pilot ending later than its first one holds them in the other order: it keeps its
    fragment (it used to be handed over to an identical one at every decision)."""
    c = _controller(tfwd=600)
    task = [TaskSubmitted(_task("a", 1, 2))]
    (first,) = c.handle([*task, _up("p1", "n", ends_at=NOW + 500)], NOW)
    (grow,) = _of(StartFragment, c.handle([_up("p2", "m", ends_at=NOW + 5000)], NOW + 1))
    assert _nodes(grow) == ["p1/n", "p2/m"] and grow.after == first.generation
    c.handle([FragmentReady("a", grow.generation)], NOW + 2)
    # The predecessor's exit, then another pilot that comes and goes: decisions with nothing
    # to change for ``a``.
    for t, events in (
        (NOW + 3, _exits(first, {"status": "stopped", "samples": 500})),
        (NOW + 4, [_up("p3", "k", ends_at=NOW + 10)]),
        (NOW + 5, [PilotGone("p3", "bye")]),
    ):
        out = c.handle(events, t)
        assert not _of(StartFragment, out) and not _of(Signal, out), out


class _Recording(AllocatorSettings):
    """The default policy, keeping every problem it is asked to solve."""

    def __call__(self, problem):
        _PROBLEMS.append(problem)
        return super().__call__(problem)


_PROBLEMS: list = []


def test_the_allocator_is_told_whether_a_task_waits_for_a_slot() -> None:
    # speedup_balanced balances only a batch's tail: it must know when nothing waits.
    _PROBLEMS.clear()
    c = Controller(allocator=_Recording(tfwd=60, **_SETTINGS), max_tasks=1)
    (start,) = c.handle(
        [TaskSubmitted(_task("a")), TaskSubmitted(_task("b")), _up("p1", "n1")], NOW
    )
    assert [t.id for t in _PROBLEMS[-1].tasks] == ["a"] and _PROBLEMS[-1].tasks_waiting
    (after,) = _of(
        StartFragment, c.handle(_exits(start, {"status": "done", "samples": 10_000}), NOW + 1)
    )
    assert after.task == "b"
    assert [t.id for t in _PROBLEMS[-1].tasks] == ["b"] and not _PROBLEMS[-1].tasks_waiting


# --- in-place shrinks -------------------------------------------------------------------------


def _two_pilots(first_ends: float | None = None, second_ends: float | None = NOW + 1000):
    """Task a (poor scaling: P(2) = 1.1 P(1)) on one node of each of two pilots."""
    c = _controller(shrink_in_place=True)
    a = ElasticTask("a", work=10**9, min_nodes=1, max_nodes=2, task="m:f")
    a.scaling = {1: 100.0, 2: 110.0}
    ups = [_up("p1", "n1", ends_at=first_ends), _up("p2", "n2", ends_at=second_ends)]
    (start,) = _of(StartFragment, c.handle([TaskSubmitted(a), *ups], NOW))
    return c, start


def _b() -> ElasticTask:
    b = ElasticTask("b", work=10**9, min_nodes=1, max_nodes=2, task="m:f")
    b.scaling = {1: 100.0, 2: 110.0}
    return b


def test_a_shrink_that_gives_back_a_whole_pilot_is_done_in_place() -> None:
    c, start = _two_pilots()
    assert [p for p, _ in start.placement] == ["p1", "p2"]  # rank 0 on p1, the longer-lived
    out = c.handle([TaskSubmitted(_b())], NOW + 1)
    (shrink,) = _of(ShrinkFragment, out)
    assert (shrink.task, shrink.generation, shrink.keep) == ("a", 1, (0,))
    assert not _terms(out) and not _of(StartFragment, out)  # b waits for p2's node
    assert c.elastic["a"].nodes == ("p1/n1",) and c.elastic["a"].releasing == ("p2/n2",)
    assert "fragment_shrink" in _notes(out)
    # The rank on p2 leaves: its node is free, b starts there, a runs on untouched.
    out = c.handle([ProcessExited("p2", fragment_key("a", 1, 1), 0, None)], NOW + 2)
    (b,) = _of(StartFragment, out)
    assert b.task == "b" and _nodes(b) == ["p2/n2"]
    assert "fragment_shrunk" in _notes(out) and not _terms(out)
    assert c.elastic["a"].state == "running" and c.elastic["a"].releasing == ()
    out = c.handle(
        [ProcessExited("p1", fragment_key("a", 1, 0), 0, {"status": "done", "samples": 10**9})],
        NOW + 3,
    )
    assert [r.task for r in _of(Resolve, out)] == ["a"]


def test_a_pilot_at_its_walltime_is_given_back_in_place() -> None:
    c, start = _two_pilots(first_ends=NOW + 30)
    (p2,) = [g for g, (pilot, _) in enumerate(start.placement) if pilot == "p2"]
    out = c.handle([Tick()], NOW + 30 - c.walltime_notice_s)
    (shrink,) = _of(ShrinkFragment, out)  # p1's rank leaves, p2's trains on: no stop
    assert shrink.keep == (p2,) and not _terms(out) and "pilot_ending" in _notes(out)
    assert c.elastic["a"].state == "running" and c.elastic["a"].nodes == ("p2/n2",)
    out = c.handle([ProcessExited("p1", fragment_key("a", 1, 1 - p2), 0, None)], NOW + 26)
    out += c.handle([PilotGone("p1", "bye")], NOW + 30)
    assert "fragment_shrunk" in _notes(out) and not _terms(out) and not _of(StartFragment, out)
    assert c.elastic["a"].state == "running" and c.fragments[("a", 1)].running == {
        fragment_key("a", 1, p2): "p2"
    }


def test_a_preempted_pilot_is_given_back_in_place_while_min_nodes_stay() -> None:
    c, start = _two_pilots()
    (p2,) = [g for g, (pilot, _) in enumerate(start.placement) if pilot == "p2"]
    out = c.handle([PilotLeaving("p1", "preempted")], NOW + 1)
    (shrink,) = _of(ShrinkFragment, out)  # the ranks on p1 leave (their TERM came with it)
    assert shrink.keep == (p2,) and not _terms(out)
    reasons = [n.fields["reason"] for n in _of(Note, out) if n.event == "fragment_shrink"]
    assert reasons == ["preempted"]
    out = c.handle([ProcessExited("p1", fragment_key("a", 1, 1 - p2), 0, None)], NOW + 2)
    out += c.handle([PilotGone("p1", "bye")], NOW + 3)
    assert "fragment_shrunk" in _notes(out) and not _terms(out) and not _of(StartFragment, out)
    assert c.elastic["a"].state == "running" and c.preemptions == 1
    # Killed before they left (the grace was too short): the rest stop and start again.
    c, start = _two_pilots()
    c.handle([PilotLeaving("p1", "preempted")], NOW + 1)
    out = c.handle([PilotGone("p1", "lost")], NOW + 2)
    assert _terms(out) == {("p2", fragment_key("a", 1, p2))}
    assert c.fragments[("a", 1)].stop_reason == "a group ended"
    # Fewer than min_nodes would stay: the fragment checkpoints and stops everywhere.
    c, start = _two_pilots()
    c.elastic["a"].min_nodes = 2
    out = c.handle([PilotLeaving("p1", "preempted")], NOW + 1)
    assert _terms(out) == {(p, fragment_key("a", 1, g)) for g, (p, _) in enumerate(start.placement)}
    assert not _of(ShrinkFragment, out)


def test_a_shrink_the_fragment_turns_into_a_stop_restarts_at_the_new_size() -> None:
    # A task's own training loop takes the request as a stop: every launcher exits stopped.
    c, start = _two_pilots()
    c.handle([TaskSubmitted(_b())], NOW + 1)
    stopped = {"status": "stopped", "samples": 700}
    out = c.handle(_exits(start, stopped), NOW + 2)
    starts = {s.task: _nodes(s) for s in _of(StartFragment, out)}
    assert starts == {"a": ["p1/n1"], "b": ["p2/n2"]} and c.elastic["a"].samples == 700


def test_a_task_that_answered_a_shrink_in_place_by_stopping_is_not_resized_in_place_again():
    # A loop of the task's own (parsl_bf.training.elastic) takes the shrink as a stop, and its
    # result says it always will: from then on the task is resized by restarts only. It is
    # sent no joiners, and a pilot of its that is preempted stops it (no shrink in place).
    c = _controller(shrink_in_place=True, grow_in_place=True)
    a = ElasticTask("a", work=10**9, min_nodes=1, max_nodes=2, task="m:f")
    a.scaling = {1: 100.0, 2: 110.0}
    ups = [_up("p1", "n1"), _up("p2", "n2", ends_at=NOW + 1000)]
    (start,) = _of(StartFragment, c.handle([TaskSubmitted(a), *ups], NOW))
    (shrink,) = _of(ShrinkFragment, c.handle([TaskSubmitted(_b())], NOW + 1))
    assert shrink.task == "a" and a.resizes_in_place
    stopped = {"status": "stopped", "samples": 700, "resizes_in_place": False}
    out = c.handle(_exits(start, stopped), NOW + 2)
    assert "task_resizes_by_restart" in _notes(out) and not a.resizes_in_place
    starts = {s.task: s for s in _of(StartFragment, out)}
    assert _nodes(starts["a"]) == ["p1/n1"] and _nodes(starts["b"]) == ["p2/n2"]
    # A third node, worth most to a now: a grows by a warm hand-over, not in place.
    a.scaling[2] = 200.0
    out = c.handle([_up("p3", "n3", ends_at=NOW + 500)], NOW + 3)
    assert not _of(GrowFragment, out)
    (successor,) = _of(StartFragment, out)
    assert successor.task == "a" and successor.after == starts["a"].generation
    assert sorted(_nodes(successor)) == ["p1/n1", "p3/n3"]
    out = c.handle([FragmentReady("a", successor.generation)], NOW + 4)
    assert _terms(out) == {("p1", fragment_key("a", starts["a"].generation, 0))}
    c.handle(_exits(starts["a"], {"status": "stopped", "samples": 800}), NOW + 5)
    # p3 is preempted: p1 stays, enough for min_nodes, yet a stops instead of shrinking.
    out = c.handle([PilotLeaving("p3", "preempted")], NOW + 6)
    assert not _of(ShrinkFragment, out)
    keys = {fragment_key("a", successor.generation, g) for g in range(2)}
    assert {k for _, k in _terms(out)} == keys and a.state == "stopping"


def test_a_stop_at_an_in_place_resize_marks_only_a_task_that_says_it_cannot_resize() -> None:
    # The trainer stops at a shrink it cannot do this time (no result flag): it is asked again.
    c, start = _two_pilots()
    c.handle([TaskSubmitted(_b())], NOW + 1)
    out = c.handle(_exits(start, {"status": "stopped", "samples": 700}), NOW + 2)
    assert c.elastic["a"].resizes_in_place and "task_resizes_by_restart" not in _notes(out)


def test_a_task_that_says_it_cannot_resize_is_not_marked_unless_it_was_asked() -> None:
    # A plain stop (a walltime, a hand-over) of a loop of its own says nothing about resizes.
    c, start = _two_pilots()
    c.handle([PilotLeaving("p1", "cancelled")], NOW + 1)
    stopped = {"status": "stopped", "samples": 700, "resizes_in_place": False}
    c.handle(_exits(start, stopped), NOW + 2)
    assert c.elastic["a"].resizes_in_place


def test_a_shrink_not_done_in_time_stops_the_fragment() -> None:
    c, start = _two_pilots()
    c.handle([TaskSubmitted(_b())], NOW + 1)
    assert not _terms(c.handle([Tick()], NOW + 2))
    out = c.handle([Tick()], NOW + 1 + c.handover_timeout_s + 1)
    assert _terms(out) == {("p1", fragment_key("a", 1, 0)), ("p2", fragment_key("a", 1, 1))}
    assert c.elastic["a"].state == "stopping"


def test_a_shrink_within_one_launcher_is_not_done_in_place() -> None:
    # Both nodes on one pilot: one launcher, which could not report its leaving rank's exit.
    c = _controller(shrink_in_place=True)
    a = ElasticTask("a", work=10**9, min_nodes=1, max_nodes=2, task="m:f")
    a.scaling = {1: 100.0, 2: 110.0}
    c.handle([TaskSubmitted(a), _up("p1", "n1", "n2")], NOW)
    out = c.handle([TaskSubmitted(_b())], NOW + 1)
    assert not _of(ShrinkFragment, out)
    assert [s.after for s in _of(StartFragment, out) if s.task == "a"] == [1]  # a hand-over


def test_a_shrink_may_give_back_rank_0s_pilot() -> None:
    c, start = _two_pilots()
    assert [p for p, _ in start.placement] == ["p1", "p2"]
    shrink = c._shrink(c.elastic["a"], ["p2/n2"], NOW + 1)
    assert shrink is not None and shrink.keep == (1,)
    assert c.elastic["a"].nodes == ("p2/n2",) and c.elastic["a"].releasing == ("p1/n1",)


def _growing() -> tuple[Controller, StartFragment, GrowFragment]:
    """Task a (linear scaling) on p1's node; p2 comes up, and a grows onto it in place."""
    c = _controller(grow_in_place=True)
    a = ElasticTask("a", work=10**9, min_nodes=1, max_nodes=2, task="m:f")
    a.scaling = {1: 100.0, 2: 200.0}
    (start,) = _of(StartFragment, c.handle([TaskSubmitted(a), _up("p1", "n1")], NOW))
    out = c.handle([_up("p2", "n2", ends_at=NOW + 1000)], NOW + 1)
    (grow,) = _of(GrowFragment, out)
    assert not _of(StartFragment, out) and not _terms(out)  # no successor, no stop
    assert "fragment_grow" in _notes(out)
    return c, start, grow


def test_a_grow_that_keeps_every_node_is_done_in_place() -> None:
    c, start, grow = _growing()
    assert (grow.task, grow.generation, grow.first) == ("a", 1, 1)
    assert grow.placement == (("p2", ("n2",)),)
    a = c.elastic["a"]
    assert a.nodes == ("p1/n1", "p2/n2") and a.generation == 1  # the same fragment, larger
    assert set(c.fragments[("a", 1)].running) == {fragment_key("a", 1, g) for g in (0, 1)}
    # While the joiner joins, the task keeps its size: no other rescale is decided.
    out = c.handle([_up("p3", "n3")], NOW + 2)
    assert not _of(StartFragment, out) and not _of(GrowFragment, out) and not _terms(out)
    # Its first step at the new size: grown, and the cost measured is the allocator's R_up.
    out = c.handle([Rescaled("a", 0.4, in_place="grow")], NOW + 3)
    assert "fragment_grown" in _notes(out) and not c.fragments[("a", 1)].joining
    assert a.measured_grow_s == [0.4] and a.grow_cost() == 0.4
    assert not _terms(c.handle([Tick()], NOW + 3 + c.handover_timeout_s + 1))  # no deadline
    # Done: every launcher, the joiner's too, exits; the task resolves once.
    done = {"status": "done", "samples": 10**9}
    exits = [ProcessExited(p, fragment_key("a", 1, g), 0, done) for g, p in ((1, "p2"), (0, "p1"))]
    out = c.handle(exits, NOW + 4)
    assert [r.task for r in _of(Resolve, out)] == ["a"]


def test_a_grow_not_done_in_time_stops_the_fragment() -> None:
    c, start, grow = _growing()
    assert not _terms(c.handle([Tick()], NOW + 2))
    out = c.handle([Tick()], NOW + 1 + c.handover_timeout_s + 1)
    assert _terms(out) == {("p1", fragment_key("a", 1, 0)), ("p2", fragment_key("a", 1, 1))}
    assert c.elastic["a"].state == "stopping"
    assert any(n.fields.get("reason") == "grow not done" for n in _of(Note, out))


def test_a_joiner_that_ends_before_it_joined_stops_the_fragment_which_restarts() -> None:
    # A joiner refused (the trainer could not grow in place) or failed: the fragment's ranks
    # stop, and the task starts again at the decided size from the checkpoint.
    c, start, grow = _growing()
    out = c.handle([ProcessExited("p2", fragment_key("a", 1, 1), 0, None)], NOW + 2)
    assert _terms(out) == {("p1", fragment_key("a", 1, 0))}
    stopped = {"status": "stopped", "samples": 640}
    out = c.handle([ProcessExited("p1", fragment_key("a", 1, 0), 0, stopped)], NOW + 3)
    (again,) = _of(StartFragment, out)
    assert again.generation == 2 and sorted(_nodes(again)) == ["p1/n1", "p2/n2"]
    assert c.elastic["a"].samples == 640 and c.elastic["a"].restarts == 0  # not a failure


def test_a_grow_is_not_done_in_place_when_it_is_off() -> None:
    c = _controller(grow_in_place=False)
    a = ElasticTask("a", work=10**9, min_nodes=1, max_nodes=2, task="m:f")
    a.scaling = {1: 100.0, 2: 200.0}
    c.handle([TaskSubmitted(a), _up("p1", "n1")], NOW)
    out = c.handle([_up("p2", "n2", ends_at=NOW + 1000)], NOW + 1)
    assert not _of(GrowFragment, out)
    assert [s.after for s in _of(StartFragment, out)] == [1]  # a warm hand-over instead


def test_a_grow_onto_nodes_given_back_now_waits_for_them_and_is_done_in_place() -> None:
    # a (poor scaling) holds p1 and p2, b (1 node) p3. Once b's curve says it scales, a gives
    # one node back in place and b grows onto it: b trains on while a's rank there leaves,
    # and grows in place once that node is free, rather than stopping to start again.
    c = _controller(shrink_in_place=True, grow_in_place=True)
    a = ElasticTask("a", work=10**9, min_nodes=1, max_nodes=2, task="m:f")
    a.scaling = {1: 100.0, 2: 110.0}
    ups = [_up("p1", "n1", ends_at=NOW + 2000), _up("p2", "n2", ends_at=NOW + 1000)]
    (start_a,) = _of(StartFragment, c.handle([TaskSubmitted(a), *ups], NOW))
    b = ElasticTask("b", work=10**9, min_nodes=1, max_nodes=2, task="m:f")
    b.scaling = {1: 100.0, 2: 105.0}
    (start_b,) = _of(StartFragment, c.handle([TaskSubmitted(b), _up("p3", "n3")], NOW + 1))
    assert (start_b.task, _nodes(start_b)) == ("b", ["p3/n3"])
    b.scaling[2] = 200.0  # its curve, as learned from its steps
    # Any decision now moves a node: a task that needs more nodes than exist brings one.
    out = c.handle([TaskSubmitted(_task("c", 9, 9))], NOW + 2)
    (shrink,) = _of(ShrinkFragment, out)
    assert shrink.task == "a" and c.elastic["a"].releasing == ("p2/n2",)
    assert not _terms(out) and not _of(StartFragment, out) and not _of(GrowFragment, out)
    assert c.elastic["b"].state == "running" and c.elastic["b"].nodes == ("p3/n3",)
    # a's rank on p2 has left: its node is free, and b grows onto it in place.
    (g,) = [g for g, (pilot, _) in enumerate(start_a.placement) if pilot == "p2"]
    out = c.handle([ProcessExited("p2", fragment_key("a", 1, g), 0, None)], NOW + 3)
    (grow,) = _of(GrowFragment, out)
    assert (grow.task, grow.generation, grow.placement) == ("b", 1, (("p2", ("n2",)),))
    assert not _terms(out) and not _of(StartFragment, out)
    assert set(c.elastic["b"].nodes) == {"p3/n3", "p2/n2"}


# --- what the commands carry, and the shell's bookkeeping ----------------------------------


def test_a_start_carries_its_rank_layout_and_a_grow_numbers_its_joiners_after_it() -> None:
    # Two GPUs a node on p1: two ranks on each of its nodes; CPU nodes on p2 and p3: one.
    c = _controller(shrink_in_place=True, grow_in_place=True)
    c.handle([TaskSubmitted(_task("a", 1, 4))], NOW)
    up = [PilotUp("p1", ("n1", "n2"), None, gpus=2), _up("p2", "n3")]
    (start,) = _of(StartFragment, c.handle(up, NOW))
    assert start.groups == (
        RankGroup("p1", ("n1", "n2"), 0, 4, 2),
        RankGroup("p2", ("n3",), 4, 1, 1),
    )
    assert start.world == 5 and start.leave_min == 1 * 2  # min_nodes' ranks, at most per node
    c.handle([Progress("a", 5, 10.0, 100), FragmentStarted("a", 0)], NOW + 1)
    (grow,) = _of(GrowFragment, c.handle([_up("p3", "n4")], NOW + 2))
    assert (grow.first, grow.world) == (2, 5)
    assert grow.groups == (RankGroup("p3", ("n4",), 5, 1, 1),)


def test_a_shrink_names_the_ranks_that_stay_as_numbered_then() -> None:
    c = _controller(shrink_in_place=True, grow_in_place=True)
    c.handle([TaskSubmitted(_task("a", 1, 4))], NOW)
    up = [PilotUp("p1", ("n1",), None, gpus=2), _up("p2", "n2"), _up("p3", "n3")]
    (start,) = _of(StartFragment, c.handle(up, NOW))
    c.handle([Progress("a", 4, 10.0, 100), FragmentStarted("a", 0)], NOW + 1)
    leaving = start.groups[0].pilot
    (shrink,) = _of(ShrinkFragment, c.handle([PilotLeaving(leaving, "preempted")], NOW + 2))
    kept = [g for g in start.groups if g.pilot != leaving]
    assert shrink.of == 4 and shrink.ranks == tuple(
        r for g in kept for r in range(g.first, g.first + g.count)
    )


def test_a_task_that_does_not_shrink_in_place_gets_no_leave_min() -> None:
    c = _controller()  # shrink_in_place False
    c.handle([TaskSubmitted(_task("a", 1, 4))], NOW)
    (start,) = _of(StartFragment, c.handle([_up("p1", "n1")], NOW))
    assert start.leave_min is None


def test_the_outlook_is_sent_when_it_changes_and_only_then() -> None:
    c = core.Controller(allocator=AllocatorSettings(tfwd=60, **_SETTINGS))
    out = c.handle([TaskSubmitted(_task("a", 1, 3))], NOW)
    assert _of(Outlook, out) == [Outlook(3, None, 0)]  # a task that could use 3 nodes
    assert not _of(Outlook, c.handle([Evaluated("a", 0, {})], NOW + 1))  # nothing changed
    out = c.handle([_up("p1", "n1", ends_at=NOW + 100)], NOW + 2)
    (outlook,) = _of(Outlook, out)
    assert outlook.wake_at == NOW + 100 - c.walltime_notice_s and outlook.preemptions == 0
    (outlook,) = _of(Outlook, c.handle([PilotLeaving("p1", "preempted")], NOW + 3))
    assert outlook.preemptions == 1 and outlook.wake_at is None


def test_a_fragment_over_is_sent_once_every_launcher_exited_and_a_status_each_tick() -> None:
    c = core.Controller(allocator=AllocatorSettings(tfwd=60, **_SETTINGS))
    c.handle([TaskSubmitted(_task("a", 1, 4, work=1000))], NOW)
    (start,) = _of(StartFragment, c.handle([_up("p1", "n1"), _up("p2", "n2")], NOW))
    first, second = _exits(start, {"status": "done", "samples": 1000})
    assert not _of(FragmentOver, c.handle([first], NOW + 1))  # its other launcher still runs
    out = c.handle([second], NOW + 2)
    assert _of(FragmentOver, out) == [FragmentOver("a", start.generation)]
    (status,) = _of(WriteStatus, out)  # the task settled
    assert [t["state"] for t in status.snapshot["tasks"]] == ["done"]
    assert _of(WriteStatus, c.handle([Tick()], NOW + 3))
    assert not _of(WriteStatus, c.handle([Evaluated("a", 1000, {})], NOW + 4))
