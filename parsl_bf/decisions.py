"""The decisions that more than one part of parsl_bf makes, each made here once.

Each is a pure function: plain data in, the decision out, no I/O and no clock, with the policy
it carries out said in one sentence where it is defined (as AdaptDL's Pollux policy and
Parsl's HTEX ``scale_in`` state theirs). The executor's controller, the ranks of a fragment,
the providers and the replay call these rather than deciding again in their own words, so that
a rule changed here is changed everywhere it holds. Standard library only: the ranks (which
import torch) and the pilots' agents (which must not) import it alike.

- :func:`trains_on_in_place` and :func:`grows_in_place`: whether a fragment resizes in place
  or stops to start again at its new size (the controller, the ranks' ``--leave-min``, the
  replay);
- :func:`walltime_reached`, :func:`cancel_reason` and :func:`leaving_reason`: why a pilot
  ended (the providers decide; the executor reads their ``reason``);
- :func:`resolve_tfwd`: the allocator's look-ahead (the executor, ``parsl-bf replay``);
- :func:`caps_remaining_work`: whether gains stop at a task's remaining work (the allocator's
  problem, as the executor and the replay pose it).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from enum import StrEnum

__all__ = [
    "PilotEnd",
    "DEFAULT_TFWD_S",
    "IN_PLACE_REASONS",
    "WALLTIME_SLACK_S",
    "cancel_reason",
    "caps_remaining_work",
    "grows_in_place",
    "leaving_reason",
    "resolve_tfwd",
    "trains_on_in_place",
    "walltime_reached",
]

# --- resizing in place ------------------------------------------------------------------------


class PilotEnd(StrEnum):
    """Why a pilot ended or is leaving: the scheduler took its nodes back (``preempted``), it
    reached its walltime (``walltime``), or we cancelled it (``cancelled``: Parsl's scale-in, a
    shutdown). The provider decides it (:func:`walltime_reached`, :func:`cancel_reason`);
    everyone else reads its ``Pilot.reason``. A pilot's reason may also be its job's own end
    (an exit status), which is none of these."""

    PREEMPTED = "preempted"
    WALLTIME = "walltime"
    CANCELLED = "cancelled"


#: Why a pilot leaves, when a fragment that also runs on pilots that stay may give its ranks
#: there back in place instead of stopping: a cancelled pilot's ranks are ours to stop, and a
#: pilot gone took them already.
IN_PLACE_REASONS = (PilotEnd.WALLTIME, PilotEnd.PREEMPTED)


def trains_on_in_place(
    staying: int,
    leaving: int,
    min_staying: int,
    *,
    enabled: bool = True,
    task_resizes: bool = True,
) -> bool:
    """Policy: a fragment that loses some of its nodes (or ranks) keeps training in place with
    the rest, rather than stopping to start again, when in-place resizing is on, its task can
    resize in place, and at least ``min_staying`` (and at least one) stay.

    ``staying`` and ``leaving`` count nodes or ranks alike, in the unit of ``min_staying``
    (the controller and the replay count nodes against ``min_nodes``; the ranks count ranks
    against their ``--leave-min``, ``min_nodes`` × ranks per node). ``task_resizes`` is False
    for a task known to answer an in-place resize by stopping (a loop of its own,
    :mod:`parsl_bf.training.elastic`). Nothing leaving is no shrink at all: False."""
    return enabled and task_resizes and leaving > 0 and staying >= max(1, min_staying)


def grows_in_place(
    current: int, adding: int, *, enabled: bool = True, task_resizes: bool = True
) -> bool:
    """Policy: a running fragment that keeps all of its ``current`` nodes and adds ``adding``
    more takes them in where it runs, rather than stopping to start again, when in-place
    resizing is on and its task can resize in place (it is not known to refuse joiners)."""
    return enabled and task_resizes and current > 0 and adding > 0


# --- why a pilot ended --------------------------------------------------------------------------

#: Seconds of slack in :func:`walltime_reached`: the scheduler's and the pilot's own latency
#: between the walltime-end signal and the job's end.
WALLTIME_SLACK_S = 5.0


def walltime_reached(ran_s: float, walltime_s: float | None, signal_lead_s: float) -> bool:
    """Policy: a pilot that ran at least its walltime less the walltime-end signal's lead (and
    :data:`WALLTIME_SLACK_S`) ended at its walltime, however the scheduler records its end (a
    pilot that leaves on that signal exits 0); without a walltime it never does."""
    return walltime_s is not None and ran_s >= walltime_s - signal_lead_s - WALLTIME_SLACK_S


def cancel_reason(signalled: bool) -> PilotEnd:
    """Policy: a pilot we cancel is ``"cancelled"``, unless the scheduler had already signalled
    it (a preemption in its grace time, which the cancel only hastens): ``"preempted"``."""
    return PilotEnd.PREEMPTED if signalled else PilotEnd.CANCELLED


def leaving_reason(provider_reason: str | None) -> PilotEnd:
    """Policy: a pilot whose processes were signalled to leave is leaving for the reason its
    provider gives when that is ``"cancelled"`` (Parsl's scale-in, a shutdown); for anything
    else, the provider not knowing yet included, the scheduler took it back: ``"preempted"``."""
    return PilotEnd.CANCELLED if provider_reason == PilotEnd.CANCELLED else PilotEnd.PREEMPTED


# --- the allocation problem ---------------------------------------------------------------------

#: The look-ahead of an ``auto`` policy before any hole's length is known.
DEFAULT_TFWD_S = 60.0


def resolve_tfwd(tfwd: float | str, holes: Sequence[float] = ()) -> float:
    """Policy: T_fwd is the fixed number of seconds given, or under ``"auto"`` the median length
    of the holes known (the executor's pilots' walltimes, the replayed nodes' idle periods),
    :data:`DEFAULT_TFWD_S` while none is."""
    if tfwd != "auto":
        return float(tfwd)
    return float(statistics.median(holes)) if len(holes) else DEFAULT_TFWD_S


def caps_remaining_work(
    objective_caps: bool,
    cap_at_remaining_work: bool,
    cap_while_waiting: bool,
    tasks_waiting: bool,
) -> bool:
    """Policy: a task's gain stops at its remaining work always under an objective that caps it
    (``objective_caps``: ``remaining_work``), else with the cap on while no task waits for
    admission, or while tasks wait too with ``cap_while_waiting`` (the executor's fragments,
    whose successors' starts cost as much as short tasks are long; docs/policy-selection.md,
    "The remaining-work cap")."""
    if objective_caps:
        return True
    return cap_at_remaining_work and (cap_while_waiting or not tasks_waiting)
