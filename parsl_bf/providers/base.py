"""What every backfill provider records about its pilots, for the executor to read."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

from parsl.jobs.states import JobState

from ..checks import SettingError, check_count, check_number
from ..decisions import PilotEnd

__all__ = [
    "BackfillProvider",
    "Pilot",
    "SCHEDULER_ENDS",
    "SchedulerError",
    "check_blocks",
    "check_walltimes",
    "parse_walltime",
    "python_bin",
]

#: ``Pilot.reason`` of a pilot that the scheduler ended, not through any fault of its own: a
#: main job took its nodes back, or its walltime ran out. Its tasks deserve to be retried
#: elsewhere, and it is not a failed block.
SCHEDULER_ENDS = frozenset({PilotEnd.PREEMPTED, PilotEnd.WALLTIME})


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


@runtime_checkable
class BackfillProvider(Protocol):
    """What the executor, the error handler and the CLI ask of a backfill provider, beyond
    Parsl's ``ExecutionProvider`` interface.

    ``isinstance(provider, BackfillProvider)`` is true of parsl_bf's providers and of any other
    provider with these two attributes (it checks that they are there, not their types). Code
    that also takes Parsl's own providers reads them with ``getattr(provider, "pilots", {})``
    and ``getattr(provider, "emulated", False)``.
    """

    #: True when every "node" is this same machine (:class:`LocalBackfillProvider`'s
    #: emulation): the executor then gives each rank one thread. False for real clusters.
    emulated: ClassVar[bool]

    #: Every pilot submitted, by Parsl job id (what ``submit()`` returned), kept after it ends;
    #: ``Pilot.reason`` says why it ended (``"preempted"``, ``"walltime"``, ``"cancelled"``,
    #: an exit status).
    pilots: dict[str, Pilot]


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


def python_bin() -> str:
    """The directory of the driver's Python, put first on a pilot's PATH (before its
    ``worker_init``): Parsl's workers start ``process_worker_pool.py`` from PATH, and a driver
    run as ``.venv/bin/python workflow.py`` without activating the environment has it only
    there. Pilots run on a shared file system, so the same path holds on the nodes."""
    return str(Path(sys.executable).parent)


def check_walltimes(min_walltime: str | float, max_walltime: str | float) -> tuple[float, float]:
    """Seconds of ``(min_walltime, max_walltime)``: each a positive walltime, the minimum no
    longer than the maximum; else :class:`SettingError` naming the argument at fault."""
    seconds = []
    for name, value in (("min_walltime", min_walltime), ("max_walltime", max_walltime)):
        try:
            s = parse_walltime(value)
        except (ValueError, TypeError, AttributeError):
            raise SettingError(name, f'not a walltime: {value!r} (e.g. "00:30:00")') from None
        seconds.append(check_number(name, s, above=0))
    if seconds[0] > seconds[1]:
        raise SettingError(
            "min_walltime",
            f"{min_walltime!r} is longer than max_walltime ({max_walltime!r})",
        )
    return seconds[0], seconds[1]


def check_blocks(init_blocks: object, min_blocks: object, max_blocks: object) -> None:
    """Parsl's block counts: ``0 <= init_blocks, min_blocks <= max_blocks`` and
    ``max_blocks >= 1`` (with none, no pilot would ever start); else :class:`SettingError`."""
    high = check_count("max_blocks", max_blocks, 1)
    for name, value in (("init_blocks", init_blocks), ("min_blocks", min_blocks)):
        if check_count(name, value, 0) > high:
            raise SettingError(name, f"{value!r} is more than max_blocks ({max_blocks!r})")
