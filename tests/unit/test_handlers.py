"""The block error handler's and the retry handler's decisions, on plain data."""

from __future__ import annotations

import pytest
from parsl.executors.high_throughput.errors import ManagerLost, WorkerLost
from parsl.jobs.states import JobState

from parsl_bf.providers import Pilot
from parsl_bf.providers.handlers import (
    BackfillErrorHandler,
    BlockRecord,
    block_outcome,
    ended_unserved_in_a_row,
    failed_in_a_row,
    free_retry,
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
