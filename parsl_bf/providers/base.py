"""What every backfill provider records about its pilots, for the executor to read."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from parsl.jobs.states import JobState

__all__ = ["Pilot", "SchedulerError", "parse_walltime"]


class SchedulerError(RuntimeError):
    """A scheduler command failed; the message has the command and the scheduler's words."""


@dataclass
class Pilot:
    """One pilot job: where it runs and until when (wall-clock seconds, ``time.time()``)."""

    job_id: str
    nodes: list[str] = field(default_factory=list)
    state: JobState = JobState.PENDING
    started_at: float | None = None
    ends_at: float | None = None
    reason: str = ""  # why it ended: "preempted", "walltime", "cancelled", exit status
    signalled_at: float | None = None  # preemption signal sent: its grace time runs from here
    scheduler_id: str | None = None  # the batch scheduler's job id, once submitted


def parse_walltime(value: str | float | int) -> float:
    """Seconds from ``HH:MM:SS``, ``MM:SS``, ``D-HH:MM:SS`` or a number of seconds."""
    if isinstance(value, int | float):
        return float(value)
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", value.strip())
    if not m:
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"not a walltime: {value!r} (e.g. 00:30:00)") from None
    days, hours, minutes, seconds = (int(x) if x else 0 for x in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
