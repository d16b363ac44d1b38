"""The block error handler's and the retry handler's decisions, on plain data."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from parsl.executors.high_throughput.errors import ManagerLost, WorkerLost
from parsl.jobs.states import JobState, JobStatus

from parsl_bf.providers import Pilot
from parsl_bf.providers.handlers import (
    BackfillErrorHandler,
    BlockRecord,
    backoff_delay,
    block_outcome,
    ended_unserved_in_a_row,
    failed_in_a_row,
    free_retry,
    hold_deadline,
    trailing_failures,
)


def _pilot(reason: str, signalled_at: float | None = None, ends_at: float | None = None):
    return Pilot("p", state=JobState.TIMEOUT, reason=reason, signalled_at=signalled_at,
                 ends_at=ends_at)  # fmt: skip


@pytest.mark.parametrize(
    ("state", "reason", "outcome"),
    [
        # A stock HTEX says MISSING for a pilot preempted before its workers connected.
        (JobState.MISSING, "preempted", "ended"),
        (JobState.TIMEOUT, "walltime", "ended"),
        (JobState.CANCELLED, "cancelled", "ended"),
        (JobState.FAILED, "exit code 127", "failed"),
        (JobState.MISSING, "exit code 0", "failed"),  # exited without ever serving
        (JobState.RUNNING, "", "live"),
        (JobState.PENDING, "", "live"),
        (JobState.COMPLETED, "exit code 0", "ok"),
    ],
)
def test_block_outcome_trusts_the_providers_reason(state, reason, outcome) -> None:
    assert block_outcome(state, _pilot(reason)) == outcome


def test_a_submission_that_failed_has_no_pilot_and_is_a_failure() -> None:
    assert block_outcome(JobState.FAILED, None) == "failed"


def _records(*outcomes: str) -> list[BlockRecord]:
    return [BlockRecord(str(i), None, "X", o) for i, o in enumerate(outcomes)]


@pytest.mark.parametrize(
    ("outcomes", "gives_up"),
    [
        (("failed", "failed", "failed"), True),
        (("failed", "failed"), False),
        (("ok", "failed", "failed"), False),
        (("ok", "failed", "failed", "failed"), True),
        # Preemptions and live blocks between failures neither reset nor add to the count.
        (("failed", "ended", "failed", "live", "ended", "failed"), True),
        (("failed", "failed", "ok"), False),
        (("ended",) * 50, False),
    ],
)
def test_gives_up_after_threshold_failures_in_a_row(outcomes, gives_up) -> None:
    assert bool(failed_in_a_row(_records(*outcomes), 3)) is gives_up


def test_the_error_names_every_failed_block() -> None:
    handler = BackfillErrorHandler(threshold=2)
    records = [
        BlockRecord("4", "j4", "FAILED", "failed", message="exit code 127; stderr: not found"),
        BlockRecord("5", None, "FAILED", "failed", message="Failed to start block 5: disk full"),
    ]
    text = str(handler.error(records))
    assert "block 4: exit code 127; stderr: not found" in text
    assert "block 5: Failed to start block 5: disk full" in text


def test_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError, match="threshold"):
        BackfillErrorHandler(threshold=0)


LOST = ManagerLost(b"m1", "host")


@pytest.mark.parametrize(
    ("exception", "pilots", "free_so_far", "free"),
    [
        (LOST, [_pilot("preempted", signalled_at=1005.0)], 0, True),
        (WorkerLost(1, "host"), [_pilot("walltime", ends_at=1010.0)], 0, True),
        # The pilot was preempted long before this try began: not this try's cause.
        (LOST, [_pilot("preempted", signalled_at=900.0)], 0, False),
        # No pilot was ended by the scheduler: the loss is the task's (or the node's) own.
        (LOST, [_pilot("exit code 1", signalled_at=1005.0)], 0, False),
        (LOST, [], 0, False),
        # The task's own error always costs a retry.
        (ValueError("bad input"), [_pilot("preempted", signalled_at=1005.0)], 0, False),
        # At most max_free free retries.
        (LOST, [_pilot("preempted", signalled_at=1005.0)], 10, False),
    ],
)
def test_free_retry_only_for_a_loss_with_a_preempted_pilot(
    exception, pilots, free_so_far, free
) -> None:
    assert free_retry(exception, 1000.0, free_so_far, pilots, 10, 5.0) is free


def test_no_free_retry_without_a_launch_time() -> None:
    assert not free_retry(LOST, None, 0, [_pilot("preempted", signalled_at=1.0)], 10, 5.0)


def test_no_retry_once_the_executor_gave_up() -> None:
    from parsl.executors.errors import BadStateException

    from parsl_bf.providers import PreemptionRetries

    error = BadStateException(None, RuntimeError("3 backfill pilots in a row failed"))
    assert PreemptionRetries()(error, {"fail_count": 1, "fail_cost": 0}) > 1e9


def test_pilots_preempted_before_serving_are_counted_in_a_row() -> None:
    def rec(i, state, outcome):
        return BlockRecord(str(i), None, state, outcome)

    blocks = [
        rec(0, "TIMEOUT", "ended"),  # served (an HTEX keeps TIMEOUT for a connected block)
        rec(1, "MISSING", "ended"),
        rec(2, "MISSING", "ended"),
        rec(3, "RUNNING", "live"),
        rec(4, "MISSING", "ended"),
    ]
    assert ended_unserved_in_a_row(blocks) == 3
    assert ended_unserved_in_a_row([*blocks, rec(5, "COMPLETED", "ok")]) == 0


def test_backoff_doubles_from_its_first_delay_up_to_its_cap() -> None:
    delays = [backoff_delay(k, 2.0, 60.0) for k in range(8)]
    assert delays == [0.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    # Never shrinks with more failures, never passes the cap, even after very many.
    assert all(a <= b for a, b in itertools.pairwise(delays))
    assert backoff_delay(100_000, 2.0, 60.0) == 60.0
    assert backoff_delay(3, 0.0, 60.0) == 0.0  # backoff_s=0: no hold


@pytest.mark.parametrize(
    ("outcomes", "run"),
    [
        (("failed", "failed"), 2),
        (("failed", "failed", "ok"), 0),  # an ok block ends the run
        (("failed", "ok", "failed"), 1),
        # Preemptions, scale-in and live blocks neither reset nor add to the count.
        (("failed", "ended", "failed", "live", "ended"), 2),
        (("ok", "ended", "live"), 0),
        ((), 0),
    ],
)
def test_trailing_failures_count_like_the_threshold(outcomes, run) -> None:
    assert len(trailing_failures(_records(*outcomes))) == run


def test_the_threshold_is_reached_exactly_when_the_trailing_run_is_long_enough() -> None:
    for n in range(6):
        for outcomes in itertools.product(("ok", "failed", "ended", "live"), repeat=n):
            records = _records(*outcomes)
            assert bool(failed_in_a_row(records, 3)) is (len(trailing_failures(records)) >= 3)


def _failed(block: int, at: float | None) -> BlockRecord:
    return BlockRecord(str(block), None, "FAILED", "failed", failed_at=at)


def test_the_hold_runs_from_the_latest_failure_for_the_run_so_far() -> None:
    assert hold_deadline([], 2.0, 60.0) == 0.0
    assert hold_deadline([_failed(0, 100.0)], 2.0, 60.0) == 102.0
    assert hold_deadline([_failed(0, 100.0), _failed(1, 110.0)], 2.0, 60.0) == 114.0
    # Two pilots that were starting together failed out of order: the later sighting counts.
    assert hold_deadline([_failed(0, 120.0), _failed(1, 110.0)], 2.0, 60.0) == 124.0
    ok = BlockRecord("2", None, "COMPLETED", "ok")
    assert hold_deadline([_failed(0, 100.0), _failed(1, 110.0), ok], 2.0, 60.0) == 0.0
    preempted = BlockRecord("2", None, "MISSING", "ended")
    assert hold_deadline([_failed(0, 100.0), preempted], 2.0, 60.0) == 102.0


class _Executor:
    """What the handler reads of a BlockProviderExecutor."""

    label = "bf"
    writes_status = True  # the handler writes no status file
    bad_state_is_set = False

    def __init__(self) -> None:
        self.provider = SimpleNamespace(pilots={})
        self.blocks_to_job_id: dict[str, str] = {}
        self.error: Exception | None = None

    def set_bad_state_and_fail_all(self, exception: Exception) -> None:
        self.bad_state_is_set, self.error = True, exception


def test_the_handler_holds_new_pilots_after_each_failed_start() -> None:
    handler = BackfillErrorHandler(threshold=4, console=False, backoff_s=2.0, max_backoff_s=5.0)
    executor = _Executor()
    failed = JobStatus(JobState.FAILED, "exit code 3")
    assert handler.holding(0.0) == 0.0  # nothing seen yet

    handler(executor, {"0": failed}, now=100.0)
    assert handler.hold_until == 102.0
    assert handler.holding(101.0) == 1.0
    assert handler.holding(102.0) == 0.0
    assert handler.summary({})["backoff_s_left"] >= 0.0

    # A pilot starting after the hold does not end it early or extend it.
    handler(executor, {"0": failed, "1": JobStatus(JobState.PENDING)}, now=103.0)
    assert handler.hold_until == 102.0
    # Its failure doubles the delay, from when it was first seen, not from each later poll.
    handler(executor, {"0": failed, "1": failed}, now=110.0)
    handler(executor, {"0": failed, "1": failed}, now=112.0)
    assert handler.blocks["1"].failed_at == 110.0
    assert handler.holding(111.0) == 3.0

    # A pilot the scheduler took back, even reported MISSING, counts neither way.
    executor.blocks_to_job_id["2"] = "j2"
    executor.provider.pilots["j2"] = Pilot("j2", state=JobState.TIMEOUT, reason="preempted")
    status = {"0": failed, "1": failed, "2": JobStatus(JobState.MISSING)}
    handler(executor, status, now=120.0)
    assert handler.hold_until == 114.0

    # A third failure: the capped delay; still short of the threshold.
    handler(executor, status | {"3": failed}, now=130.0)
    assert handler.hold_until == 135.0 and not executor.bad_state_is_set

    # An ok block ends the hold at once.
    handler(executor, status | {"3": failed, "4": JobStatus(JobState.COMPLETED)}, now=131.0)
    assert handler.hold_until == 0.0 and handler.holding(131.0) == 0.0


def test_backoff_settings_must_be_finite_and_not_negative() -> None:
    with pytest.raises(ValueError, match="backoff_s"):
        BackfillErrorHandler(backoff_s=-1.0)
    with pytest.raises(ValueError, match="backoff_s"):
        BackfillErrorHandler(max_backoff_s=float("inf"))


def test_a_backfill_executor_submits_no_pilot_while_the_handler_holds() -> None:
    import time

    from parsl_bf.executor import BackfillExecutor
    from parsl_bf.providers import LocalBackfillProvider

    provider = LocalBackfillProvider(nodes=1)
    executor = BackfillExecutor(label="bf", provider=provider)
    handler = executor.block_error_handler
    assert isinstance(handler, BackfillErrorHandler)
    handler.hold_until = time.time() + 3600.0  # as after a failed start
    assert executor.scale_out_facade(1) == []
    assert provider.pilots == {} and executor.blocks_to_job_id == {}
