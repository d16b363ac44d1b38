"""What a Parsl executor over backfill pilots needs to survive preemption and still fail loudly.

Parsl's default ``block_error_handler`` (``simple_error_handler``) counts every ``FAILED`` or
``MISSING`` block as a failure and puts the executor in a bad state once all blocks so far
failed. A stock HighThroughputExecutor reports a pilot that was preempted before its workers
connected as ``MISSING`` (it rewrites every terminal, never-connected block), so the first
short hole ends the run. And a preempted pilot's tasks fail with ``ManagerLost``, which spends
one of each task's ``retries``.

:class:`BackfillErrorHandler` asks the provider why each pilot ended: a pilot ended by the
scheduler (preempted, or at its walltime) or cancelled by scale-in is not a failure, whatever
state the executor reports. Real failed starts (the provider could not submit, the pilot exited
on its own without serving, a bad ``worker_init``) are printed on the console as they happen,
recorded for ``parsl-bf status``, and after ``threshold`` of them in a row the executor is put
in Parsl's bad state: it stops asking for pilots and fails its outstanding tasks with the
pilots' errors. Between failed starts a BackfillExecutor waits, longer after each one
(:func:`backoff_delay`), instead of submitting the next pilot on Parsl's next poll.

:class:`PreemptionRetries` is a ``retry_handler`` that charges nothing for a task lost with a
pilot that the scheduler took back while the task ran, so preemptions do not use up its
retries (at most ``max_free`` times a task, in case the loss was the task's own doing), and
does not retry a task of an executor that gave up (its pilots cannot start).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from parsl.executors.errors import BadStateException
from parsl.executors.high_throughput.errors import ManagerLost, WorkerLost
from parsl.jobs.errors import TooManyJobFailuresError
from parsl.jobs.states import JobState, JobStatus

from ..decisions import PilotEnd
from .base import SCHEDULER_ENDS, Pilot

__all__ = [
    "BackfillErrorHandler",
    "BlockRecord",
    "PreemptionRetries",
    "backoff_delay",
    "block_outcome",
    "ended_unserved_in_a_row",
    "failed_in_a_row",
    "free_retry",
    "hold_deadline",
    "trailing_failures",
]

log = logging.getLogger(__name__)

_LIVE = (JobState.PENDING, JobState.RUNNING, JobState.HELD, JobState.UNKNOWN)


def block_outcome(state: JobState, pilot: Pilot | None) -> str:
    """How a block counts: ``"live"`` (not ended yet), ``"ended"`` (ended by the scheduler or
    by scale-in: neither success nor failure), ``"failed"`` or ``"ok"``.

    ``pilot`` is the provider's record of the block's pilot (None when the provider keeps none,
    or when the submission itself failed); its ``reason`` overrides the executor's state,
    which may say ``MISSING`` for a pilot preempted before its workers connected.
    """
    if pilot is not None and (pilot.reason in SCHEDULER_ENDS or pilot.reason == PilotEnd.CANCELLED):
        return "ended"
    if state in (JobState.FAILED, JobState.MISSING):
        return "failed"
    if state in _LIVE:
        return "live"
    return "ok"


@dataclass
class BlockRecord:
    """One block as ``parsl-bf status`` shows it."""

    block: str
    job: str | None
    state: str
    outcome: str
    reason: str = ""
    message: str = ""
    #: When the handler first saw the block failed (epoch seconds); None unless it failed.
    failed_at: float | None = None


def _message(status: JobStatus) -> str:
    """The status's message and the tail of the pilot's stderr, on one line."""
    parts = [status.message or ""]
    if status.exit_code is not None:
        parts.append(f"exit code {status.exit_code}")
    try:
        stderr = status.stderr_summary
    except OSError:  # the pilot's files are gone
        stderr = None
    if stderr and stderr.strip():
        parts.append("stderr: " + " | ".join(stderr.strip().splitlines()[-3:]))
    return "; ".join(p for p in parts if p)


class BackfillErrorHandler:
    """A ``block_error_handler`` for executors whose blocks are backfill pilots.

    Parameters
    ----------
    threshold : int
        Failed blocks in a row (blocks ended by the scheduler or by scale-in, and blocks not
        ended yet, do not count either way) after which the executor gives up: it stops
        submitting pilots and fails every outstanding task with the blocks' errors.
    console : bool
        Print each failed block on stderr as it is seen (Parsl's own log is in the run
        directory, where a user looking at a silent run does not look).
    backoff_s : float
        After a failed block, how long new pilots are held (from when the failure was seen),
        so that a broken setup (a bad ``worker_init``, a full disk) does not start failing
        pilots back to back; the hold doubles with each further failure in a row (counted as
        for ``threshold``) and an ok block ends it. 0: no hold.
    max_backoff_s : float
        The longest hold.

    Notes
    -----
    The handler only computes the hold (:attr:`hold_until`, :meth:`holding`); the executor
    honours it. A :class:`~parsl_bf.executor.BackfillExecutor` submits no pilot while it
    holds. Parsl offers no hook for its own executors to wait between blocks (the scaling
    strategy calls ``scale_out_facade`` on every poll), so a stock HighThroughputExecutor with
    this handler still resubmits at once: there the ``threshold`` alone bounds the failed
    starts.
    """

    def __init__(
        self,
        threshold: int = 3,
        console: bool = True,
        backoff_s: float = 2.0,
        max_backoff_s: float = 60.0,
    ) -> None:
        if threshold < 1:
            raise ValueError(f"threshold must be at least 1 (got {threshold})")
        if not (0 <= backoff_s < math.inf and 0 <= max_backoff_s < math.inf):
            raise ValueError(
                f"backoff_s and max_backoff_s must be finite and >= 0 "
                f"(got {backoff_s}, {max_backoff_s})"
            )
        self.threshold, self.console = threshold, console
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        #: Until when (epoch seconds) new pilots are held after the latest failures in a row;
        #: 0 when the last block that counts was ok (or there is none yet). May be past.
        self.hold_until: float = 0.0
        #: Every block seen, by block id, as of the last poll.
        self.blocks: dict[str, BlockRecord] = {}
        #: Failed blocks already reported (each is printed once).
        self._reported: set[str] = set()
        self._written: str | None = None  # the last status file content, not rewritten unchanged
        self._warned_unserved = False

    def __call__(
        self, executor: Any, status: dict[str, JobStatus], now: float | None = None
    ) -> None:
        """One poll's block states (Parsl passes ``executor`` and ``status``; ``now``, epoch
        seconds, defaults to the clock)."""
        now = time.time() if now is None else now
        provider = getattr(executor, "provider", None)
        pilots: dict[str, Pilot] = getattr(provider, "pilots", None) or {}
        for block_id in sorted(status, key=_block_order):
            js = status[block_id]
            job_id = executor.blocks_to_job_id.get(block_id)
            pilot = pilots.get(job_id) if job_id is not None else None
            outcome = block_outcome(js.state, pilot)
            previous = self.blocks.get(block_id)
            failed_at = None
            if outcome == "failed":  # the hold runs from when the failure was first seen
                kept = previous.failed_at if previous is not None else None
                failed_at = now if kept is None else kept
            record = BlockRecord(
                block_id,
                None if job_id is None else str(job_id),
                js.state.name,
                outcome,
                pilot.reason if pilot is not None else "",
                _message(js) if outcome == "failed" else "",
                failed_at,
            )
            self.blocks[block_id] = record
            if outcome == "failed" and block_id not in self._reported:
                self._reported.add(block_id)
                log.error("%s: block %s failed: %s", executor.label, block_id, record.message)
                if self.console:
                    print(
                        f"parsl-bf: executor {executor.label}: block {block_id} failed: "
                        f"{record.message or js.state.name}",
                        file=sys.stderr,
                        flush=True,
                    )
        if not getattr(executor, "writes_status", False):
            self._write_status(executor, pilots)
        ordered = sorted(self.blocks.values(), key=lambda r: _block_order(r.block))
        self.hold_until = hold_deadline(ordered, self.backoff_s, self.max_backoff_s)
        unserved = ended_unserved_in_a_row(ordered)
        if unserved >= UNSERVED_WARNING and not self._warned_unserved:
            self._warned_unserved = True
            warning = (
                f"{unserved} pilots in a row were preempted before their workers connected: "
                "are the holes shorter than the workers' start-up (worker_init, imports)?"
            )
            log.warning("%s: %s", executor.label, warning)
            if self.console:
                print(f"parsl-bf: executor {executor.label}: {warning}", file=sys.stderr)
        failed = failed_in_a_row(ordered, self.threshold)
        if failed and not executor.bad_state_is_set:
            error = self.error(failed)
            if self.console:
                print(f"parsl-bf: executor {executor.label}: {error}", file=sys.stderr)
            executor.set_bad_state_and_fail_all(error)

    def holding(self, now: float | None = None) -> float:
        """Seconds left (0 when none) before the executor may submit the next pilot; ``now``,
        epoch seconds, defaults to the clock."""
        now = time.time() if now is None else now
        return max(0.0, self.hold_until - now)

    def error(self, failed: list[BlockRecord]) -> TooManyJobFailuresError:
        """The exception the outstanding tasks fail with: every failed block's error."""
        lines = [f"{len(failed)} backfill pilots in a row failed; giving up:"]
        lines += [f"block {r.block}: {r.message or r.state}" for r in failed]
        return TooManyJobFailuresError("\n".join(lines))

    def summary(self, pilots: dict[str, Pilot]) -> dict[str, Any]:
        """The blocks, pilots and preemptions, as ``parsl-bf status`` reads them."""
        now = time.time()
        return {
            "blocks": [asdict(r) for r in self.blocks.values()],
            "pilots": [
                {
                    "pilot": p.job_id,
                    "nodes": list(p.nodes),
                    "ends_in_s": None if p.ends_at is None else round(p.ends_at - now),
                    "leaving": p.signalled_at is not None,
                }
                for p in list(pilots.values())
                if p.state is JobState.RUNNING
            ],
            "preemptions": sum(1 for p in list(pilots.values()) if p.reason == PilotEnd.PREEMPTED),
            "failed_blocks": sum(1 for r in self.blocks.values() if r.outcome == "failed"),
            "backoff_s_left": round(self.holding(now), 1),
        }

    def _write_status(self, executor: Any, pilots: dict[str, Pilot]) -> None:
        """``<run_dir>/<label>/status.json``, the file ``parsl-bf status`` reads."""
        run_dir = getattr(executor, "run_dir", None)
        if not run_dir:
            return
        state = {"label": executor.label, "kind": type(executor).__name__}
        state |= self.summary(pilots)
        # The executors whose status this handler writes (Parsl's own) do not wait for the hold.
        del state["backoff_s_left"]
        text = json.dumps(state, sort_keys=True)
        if text == self._written:
            return
        path = Path(run_dir) / executor.label / "status.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state | {"updated": time.time()}, indent=1))
            tmp.replace(path)
        except OSError as exc:  # a full disk must not stop error handling
            log.warning("%s: cannot write %s: %s", executor.label, path, exc)
            return
        self._written = text


def failed_in_a_row(blocks: list[BlockRecord], threshold: int) -> list[BlockRecord]:
    """The last ``threshold`` blocks (in submission order) that succeeded or failed, if they
    all failed; else nothing. Blocks not ended yet and blocks the scheduler or scale-in ended
    count neither way."""
    counted = [r for r in blocks if r.outcome in ("ok", "failed")]
    recent = counted[-threshold:]
    if len(recent) == threshold and all(r.outcome == "failed" for r in recent):
        return recent
    return []


def trailing_failures(blocks: list[BlockRecord]) -> list[BlockRecord]:
    """The failed blocks at the end of ``blocks`` (in submission order) among those that
    succeeded or failed; an ok block ends the run. Blocks not ended yet and blocks the
    scheduler or scale-in ended count neither way, as for :func:`failed_in_a_row`."""
    run: list[BlockRecord] = []
    for r in reversed(blocks):
        if r.outcome == "ok":
            break
        if r.outcome == "failed":
            run.append(r)
    return run[::-1]


def backoff_delay(failures: int, backoff_s: float, max_backoff_s: float) -> float:
    """How long new pilots are held after ``failures`` failed blocks in a row: 0 for none,
    then ``backoff_s`` doubled with each further failure, at most ``max_backoff_s``."""
    if failures <= 0:
        return 0.0
    # The exponent is capped so that a long run of failures cannot overflow the float.
    return min(backoff_s * 2.0 ** min(failures - 1, 64), max_backoff_s)


def hold_deadline(blocks: list[BlockRecord], backoff_s: float, max_backoff_s: float) -> float:
    """Until when (epoch seconds) new pilots are held: from when the latest of the failures
    in a row was first seen (``failed_at``; the last one submitted, unless blocks that were
    starting together fail out of order), :func:`backoff_delay` of how many there are; 0 when
    there are none."""
    run = trailing_failures(blocks)
    seen = [r.failed_at for r in run if r.failed_at is not None]
    if not seen:
        return 0.0
    return max(seen) + backoff_delay(len(run), backoff_s, max_backoff_s)


#: Pilots preempted before their workers connected, in a row, that make the handler warn: such
#: pilots are not failures, but if none ever connects the run makes no progress.
UNSERVED_WARNING = 5


def ended_unserved_in_a_row(blocks: list[BlockRecord]) -> int:
    """How many of the last ended blocks (in submission order, live ones skipped) were ended
    by the scheduler before they served (a stock HTEX reports them ``MISSING``)."""
    count = 0
    for r in reversed(blocks):
        if r.outcome == "live":
            continue
        if r.outcome == "ended" and r.state == "MISSING":
            count += 1
        else:
            break
    return count


def _block_order(block_id: str) -> tuple[int, str]:
    return (int(block_id), "") if block_id.isdigit() else (sys.maxsize, block_id)


class PreemptionRetries:
    """A ``retry_handler`` (``Config(retry_handler=PreemptionRetries(), retries=N)``): a task
    lost with its pilot while the scheduler took the pilot back costs no retry.

    Parameters
    ----------
    max_free : int
        The most free retries of one task; after that a loss costs 1 as usual (a task that
        brings its own worker down would otherwise be retried forever).
    slack_s : float
        How long before the try's launch a pilot's end still counts (clocks of the submit side
        and of the scheduler differ a little).
    """

    def __init__(self, max_free: int = 10, slack_s: float = 5.0) -> None:
        self.max_free, self.slack_s = max_free, slack_s

    def __call__(self, exception: BaseException, task_record: Any) -> float:
        if isinstance(exception, BadStateException):
            return math.inf  # the executor gave up (pilots cannot start): retrying cannot help
        # fail_count already counts this failure; fail_cost does not yet.
        free_so_far = task_record["fail_count"] - 1 - task_record["fail_cost"]
        launched = task_record.get("try_time_launched")
        try:
            executor = task_record["dfk"].executors[task_record["executor"]]
        except (KeyError, AttributeError):
            return 1.0
        pilots = getattr(getattr(executor, "provider", None), "pilots", None) or {}
        free = free_retry(
            exception,
            launched.timestamp() if isinstance(launched, datetime.datetime) else None,
            free_so_far,
            list(pilots.values()),
            self.max_free,
            self.slack_s,
        )
        return 0.0 if free else 1.0


def free_retry(
    exception: BaseException,
    launched_at: float | None,
    free_so_far: int,
    pilots: list[Pilot],
    max_free: int,
    slack_s: float,
) -> bool:
    """Whether a failed try is retried at no cost: it was lost with its worker pool
    (``ManagerLost``, ``WorkerLost``), a pilot was ended by the scheduler after the try began
    (``launched_at``, epoch seconds, less ``slack_s``), and the task has had fewer than
    ``max_free`` free retries."""
    if not isinstance(exception, ManagerLost | WorkerLost) or launched_at is None:
        return False
    if free_so_far >= max_free:
        return False
    since = launched_at - slack_s
    for pilot in pilots:
        ended_at = pilot.signalled_at or pilot.ends_at
        if pilot.reason in SCHEDULER_ENDS and ended_at is not None and ended_at >= since:
            return True
    return False
