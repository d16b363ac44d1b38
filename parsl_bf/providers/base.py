"""What every backfill provider records about its pilots, for the executor to read."""

from __future__ import annotations

import math
import numbers
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

from parsl.jobs.states import JobState

__all__ = [
    "BackfillProvider",
    "Pilot",
    "SCHEDULER_ENDS",
    "SchedulerError",
    "SettingError",
    "check_blocks",
    "check_count",
    "check_number",
    "check_walltimes",
    "parse_walltime",
    "python_bin",
]

#: ``Pilot.reason`` of a pilot that the scheduler ended, not through any fault of its own: a
#: main job took its nodes back, or its walltime ran out. Its tasks deserve to be retried
#: elsewhere, and it is not a failed block.
SCHEDULER_ENDS = frozenset({"preempted", "walltime"})


class SchedulerError(RuntimeError):
    """A scheduler command failed; the message has the command and the scheduler's words."""


class SettingError(ValueError):
    """A constructor argument that is out of range or inconsistent.

    ``field`` names the argument, so that the YAML loader can point at that key's own line;
    ``message`` says what is wrong without the name. ``str()`` has both (``"nodes: must be at
    least 1, got -3"``), for Python configs.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


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


def check_count(name: str, value: object, minimum: int = 1) -> int:
    """``value`` if it is an int of at least ``minimum``, else :class:`SettingError`."""
    # bool is an int subclass, but ``nodes: true`` is a mistake, not one node.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SettingError(name, f"expected an integer, got {value!r}")
    if value < minimum:
        raise SettingError(name, f"must be at least {minimum}, got {value!r}")
    return int(value)


def check_number(
    name: str,
    value: object,
    *,
    above: float | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
) -> float:
    """``value`` as a float if it is a finite number within the bounds given (``above``:
    strictly greater), else :class:`SettingError`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SettingError(name, f"expected a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):  # nan fails every comparison, so it would pass them all
        raise SettingError(name, f"must be a finite number, got {value!r}")
    if above is not None and not number > above:
        raise SettingError(name, f"must be more than {above:g}, got {value!r}")
    if at_least is not None and number < at_least:
        raise SettingError(name, f"must be at least {at_least:g}, got {value!r}")
    if at_most is not None and number > at_most:
        raise SettingError(name, f"must be at most {at_most:g}, got {value!r}")
    return number


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
