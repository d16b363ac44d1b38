"""``PilotProvider``: the base of parsl_bf's providers, local and batch.

It owns what they share: the record of every pilot (``pilots``, ``resources``), one lock, and
Parsl's ``status()``/``cancel()`` answers built from that record. A subclass starts pilots
(``submit()``), may bring their states up to date before a status report (``_update``), and
ends the live pilots it is asked to cancel (``_end``).
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from parsl.jobs.states import TERMINAL_STATES, JobState, JobStatus
from parsl.providers.base import ExecutionProvider
from parsl.utils import RepresentationMixin

from .base import Pilot

__all__ = ["PilotProvider"]


class PilotProvider(ExecutionProvider, RepresentationMixin):
    """A Parsl provider whose blocks are backfill pilots, each recorded in ``pilots``.

    Implements :class:`~parsl_bf.providers.base.BackfillProvider`. ``resources[job_id]`` is
    Parsl's usual record of a block (``job_id``: the scheduler's id or None, and the
    ``job_stdout_path``/``job_stderr_path`` of the pilot once it has them), which ``status()``
    reports.
    """

    #: True when every "node" is this same machine (see ``BackfillProvider.emulated``).
    emulated: ClassVar[bool] = False

    def __init__(self, label: str, status_polling_interval: int) -> None:
        self._label = label
        self._polling_interval = status_polling_interval
        self.nodes_per_block = 1  # nominal: each pilot's real size is in self.pilots
        self.script_dir: str | None = None
        self.resources: dict[str, dict[str, Any]] = {}
        self.pilots: dict[str, Pilot] = {}
        self._lock = threading.RLock()  # the record, and whatever a subclass keeps with it
        self._count = 0  # pilots submitted so far, for their job ids

    # --- what a subclass supplies -----------------------------------------------------------

    def _update(self, job_ids: list[str]) -> None:
        """Bring these pilots' states up to date before ``status()`` reports them (called with
        the lock held; default: nothing, the states are kept current elsewhere)."""

    @abstractmethod
    def _end(self, job_ids: list[str]) -> None:
        """End these pilots, every one known and not yet ended (called with the lock held):
        set a state and a reason at once (``CANCELLED``, ``"cancelled"``) where nothing is
        left to wait for, or start ending them and let the state follow."""

    # --- Parsl's provider interface ----------------------------------------------------------

    def status(self, job_ids: Sequence[Any]) -> list[JobStatus]:
        """Each pilot's state, its reason as the message, and its output files; ``UNKNOWN``
        for a job id this provider never returned."""
        with self._lock:
            self._update([j for j in job_ids if j in self.pilots])
            return [self._status(job_id) for job_id in job_ids]

    def cancel(self, job_ids: Sequence[Any]) -> list[bool]:
        """End the pilots; for each id, whether this call ended it (False: unknown, or it had
        ended already)."""
        with self._lock:
            answers: list[bool] = []
            live: list[str] = []
            for job_id in job_ids:
                pilot = self.pilots.get(job_id)
                ends = pilot is not None and pilot.state not in TERMINAL_STATES
                ends = ends and job_id not in live  # the same id twice: ended once
                if ends:
                    live.append(job_id)
                answers.append(ends)
            if live:
                self._end(live)
            return answers

    def _status(self, job_id: Any) -> JobStatus:
        pilot = self.pilots.get(job_id)
        if pilot is None:
            return JobStatus(JobState.UNKNOWN, "unknown job id")
        res = self.resources.get(job_id, {})
        return JobStatus(
            pilot.state,
            pilot.reason or None,
            stdout_path=res.get("job_stdout_path"),
            stderr_path=res.get("job_stderr_path"),
        )

    @property
    def label(self) -> str:
        return self._label

    @property
    def status_polling_interval(self) -> int:
        return self._polling_interval
