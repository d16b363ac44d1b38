"""The executor's decision thread (:class:`DecisionLoop`): what arrived (channel messages,
submissions) drained in batches and turned into :mod:`~parsl_bf.executor.lifecycle` events,
reading the files a process left (a fragment's result, a plain app's outcome, progress
reports, ready files); one call of the controller's ``handle`` per batch; its commands
carried out (:mod:`.carrying`)."""

from __future__ import annotations

import json
import logging
import queue
import time
from pathlib import Path
from typing import Any

from ..decisions import PilotEnd, leaving_reason
from ..pilot.outcome import RunnerError, no_outcome_error, read_outcome
from ..pilot.wire import Op, Refused, standbys_for
from ..training.reports import ReportEvent, ReportTail
from . import channel
from . import lifecycle as lc
from .carrying import _NO_STDERR, ShellState, _tail
from .controller import ElasticTask

__all__ = ["DecisionLoop", "TICK_S", "READY_POLL_S"]

log = logging.getLogger(__name__)

# Deadlines, progress reports and ready files are looked at this often.
TICK_S = 1.0
#: How often a warm successor's ready file is looked for between ticks (a ready standby rank
#: is set up in a fraction of a second, and its predecessor trains on until it is seen).
READY_POLL_S = 0.02


class DecisionLoop(ShellState):
    """I/O → events → controller → commands → I/O. A role of
    :class:`~parsl_bf.executor.executor.BackfillExecutor`, on its state (:class:`ShellState`)."""

    def _arrived(self, item: object) -> None:
        """From the channel's thread or a submitting one: queue it for the next batch."""
        self._inbox.put((time.time(), item))

    def _loop(self) -> None:
        next_tick = 0.0
        ticked_for = None  # the walltime notice a lc.Tick was added for (once each)
        while not self._stop.is_set():
            deadline = self._outlook.wake_at  # a pilot's walltime notice
            if deadline == ticked_for:
                deadline = None
            wake = next_tick if deadline is None else min(next_tick, deadline)
            timeout = min(0.5, max(0.0, wake - time.time()))
            if self._ready or self._grows:  # ready files end a hand-over, start a grow
                timeout = min(timeout, READY_POLL_S)
            self._request_grows()
            batch = self._drain(timeout=timeout)
            now = time.time()
            if now >= next_tick or (deadline is not None and now >= deadline):
                if now >= next_tick:
                    next_tick = now + TICK_S
                else:
                    ticked_for = deadline
                batch.append((now, lc.Tick()))
            elif self._ready:
                batch += [(time.time(), ready) for ready in self._readiness()]
            if not batch:
                continue
            try:
                self._decide(batch)
            except Exception:  # one bad batch must not stop every later decision
                log.exception("%s: batch %r failed", self.label, batch)

    def _drain(self, timeout: float) -> list[tuple[float, object]]:
        """Everything queued now, waiting up to ``timeout`` for the first item."""
        try:
            batch = [self._inbox.get(timeout=timeout)] if timeout > 0 else []
        except queue.Empty:
            batch = []
        while True:
            try:
                batch.append(self._inbox.get_nowait())
            except queue.Empty:
                return batch

    def _decide(self, batch: list[tuple[float, object]]) -> None:
        """One batch: its events, one controller decision, its commands carried out."""
        events: list[lc.Event] = []
        causes: list[str] = []
        for _, item in batch:
            found = self._events_of(item)
            events += found
            causes += [c for c in map(_cause, found) if c and c not in causes]
        self._warm(events)
        now = time.time()
        with self._lock:
            commands = self.controller.handle(events, now)
        for command in commands:
            self._sent = []
            try:
                self._carry_out(command)
            except Exception as exc:  # a full disk: the batch's other commands still count
                self._not_carried_out(command, exc)
        solved = [c.solve_s for c in commands if isinstance(c, lc.Solved)]
        decided = [c for c in commands if isinstance(c, lc.DECISIONS)]
        if decided or solved or any(c.startswith("pilot") for c in causes):
            # From the batch's first arrival to its commands sent to the pilots.
            self.event_log.decision(
                causes[0] if causes else "tick",
                time.time() - min(t for t, _ in batch),
                [_command_name(c) for c in decided],
                solved[-1] if solved else None,
                causes=causes,
                events=len(events),
            )

    def _warm(self, events: list[lc.Event]) -> None:
        """Ask pilots for standby ranks (one per node), from the first elastic task on."""
        if not self.warm_ranks or self.server is None:
            return
        first = not self._training and any(
            isinstance(e, lc.TaskSubmitted) and isinstance(e.task, ElasticTask) for e in events
        )
        self._training = self._training or first
        if not self._training or not (first or any(isinstance(e, lc.PilotUp) for e in events)):
            return
        self._warmed.intersection_update(self.server.pilots)  # forget pilots that are gone
        for pilot, up in self.server.pilots.items():
            if pilot not in self._warmed:
                self._warmed.add(pilot)
                size = standbys_for(up.nodes, up.host, up.gpus)
                self._send(pilot, {"op": Op.WARM_RANKS, "size": size, "mpiexec": self.mpiexec})

    def _events_of(self, item: object) -> list[lc.Event]:
        """The lifecycle events of one arrival, with the files it left read now."""
        log_ = self.event_log
        if isinstance(item, lc.Tick):
            return self._progress_of_live() + self._readiness() + [item]
        # Seen between ticks; a failed launch.
        if isinstance(item, lc.FragmentReady | lc.LaunchFailed):
            return [item]
        if isinstance(item, lc.TaskSubmitted):
            log_.emit(
                lc.LogEvent.TASK_SUBMITTED,
                task=item.task.id,
                elastic=isinstance(item.task, ElasticTask),
            )
            return [item]
        if isinstance(item, channel.PilotUp):
            log_.emit(
                lc.LogEvent.PILOT_UP, pilot=item.pilot, nodes=list(item.nodes), ends_at=item.ends_at
            )
            return [lc.PilotUp(item.pilot, tuple(item.nodes), item.ends_at, item.gpus)]
        if isinstance(item, channel.PilotPreempted):
            # Parsl scaling in (or shutting down) cancels pilots too: not a preemption.
            known = getattr(self.provider, "pilots", {}).get(item.pilot)
            reason = leaving_reason(known.reason if known is not None else None)
            log_.emit(lc.LogEvent(f"pilot_{reason}"), pilot=item.pilot, signal=item.signal)
            return [lc.PilotLeaving(item.pilot, reason)]
        if isinstance(item, channel.PilotGone):
            log_.emit(lc.LogEvent.PILOT_GONE, pilot=item.pilot, reason=item.reason)
            return [lc.PilotGone(item.pilot, item.reason)]
        if isinstance(item, channel.ProcessExited):
            return self._exit_of(item)
        if isinstance(item, Refused):
            log_.emit(lc.LogEvent.REFUSED, peer=item.peer, reason=item.reason, count=item.count)
        return []

    def _exit_of(self, item: channel.ProcessExited) -> list[lc.Event]:
        try:
            task_id, generation, _group = lc.parse_key(item.key)
        except ValueError:
            log.warning("%s: exit of an unknown process %r", self.label, item.key)
            return []
        sub = self._submissions.get(task_id)
        if sub is None:
            return []
        if generation is None:  # a plain app: its outcome, if it left one
            try:
                outcome: Any = read_outcome(sub.directory.app_out)
            except OSError:  # None, and it runs again, unless its runner or launch said why
                error = _no_outcome(item, sub.directory)
                outcome = None if error is None else (False, error)
            except RunnerError as exc:
                outcome = (False, exc)
            return [lc.ProcessExited(item.pilot, item.key, item.code, outcome)]
        # Its last reports first: the controller knows its samples when it classifies the exit.
        result = _read_json(sub.directory.result(generation))
        return self._progress_of(task_id) + [
            lc.ProcessExited(item.pilot, item.key, item.code, result)
        ]

    def _progress_of_live(self) -> list[lc.Event]:
        return [e for t in {t for t, _ in self._live} for e in self._progress_of(t)]

    def _progress_of(self, task_id: str) -> list[lc.Event]:
        """New records of a task's progress report, as events."""
        tail = self._reports.get(task_id)
        if tail is None:
            tail = self._reports[task_id] = ReportTail(
                self._submissions[task_id].directory.progress
            )
        out: list[lc.Event] = []
        for r in tail.read():
            if r["event"] == ReportEvent.STEP:
                share = r.get("cpu_share")
                out.append(
                    lc.Progress(
                        task_id, int(r["world"]), float(r["rate"] or 0), int(r["samples"]),
                        float(share) if isinstance(share, int | float) else None,
                    )
                )  # fmt: skip
            elif r["event"] == ReportEvent.EVAL:  # the task's own metrics, for parsl-bf status
                out.append(lc.Evaluated(task_id, int(r["samples"]), dict(r.get("metrics") or {})))
            elif r["event"] in (ReportEvent.SHRUNK, ReportEvent.GROWN):
                asked = self._resize_asked.pop(task_id, None)
                seconds = r["first_step_at"] - asked if asked and r.get("first_step_at") else -1
                kind = "shrink" if r["event"] == ReportEvent.SHRUNK else "grow"
                out.append(lc.Rescaled(task_id, seconds, in_place=kind))
            elif r["event"] == ReportEvent.START:
                out.append(lc.FragmentStarted(task_id, int(r.get("samples") or 0)))
                if r.get("stopped_at") and r.get("first_step_at"):
                    # From the later of the old fragment's stop and the new one's process
                    # start: time the task waited for nodes is not part of a rescale's cost.
                    began = max(r["stopped_at"], r.get("process_started_at") or 0.0)
                    out.append(lc.Rescaled(task_id, r["first_step_at"] - began))
        return out

    def _request_grows(self) -> None:
        """Write the grow request of each in-place grow whose joiners are all set up: the
        fragment takes them in at its next step, with no wait for one that is starting."""
        for key, (request, path) in list(self._grows.items()):
            if request.joiners_ready():
                del self._grows[key]
                request.write(path)

    def _readiness(self) -> list[lc.Event]:
        """Warm successors whose ready file appeared."""
        out: list[lc.Event] = []
        for (task_id, generation), path in list(self._ready.items()):
            if path.exists():
                del self._ready[(task_id, generation)]
                out.append(lc.FragmentReady(task_id, generation))
        return out


def _cause(event: lc.Event) -> str | None:
    """What an event is called in the decision log (None: not a cause worth naming)."""
    if isinstance(event, lc.PilotLeaving):
        return "pilot ending" if event.reason == PilotEnd.WALLTIME else f"pilot {event.reason}"
    return {
        lc.PilotUp: "pilot up",
        lc.PilotGone: "pilot gone",
        lc.TaskSubmitted: "task submitted",
        lc.ProcessExited: "process exited",
    }.get(type(event))


def _command_name(command: lc.Command) -> str:
    return f"{type(command).__name__}:{getattr(command, 'task', None) or command.key}"


def _no_outcome(item: channel.ProcessExited, directory: lc.TaskDir) -> Exception | None:
    """Why a plain app left no outcome, if its runner or its launch said (None: it was killed,
    and runs again)."""
    said = _tail(directory.app_stream("stderr"), 1)
    said = "" if said == _NO_STDERR else said
    if lc.launch_failed(item.code):
        return RunnerError(f"not launched on {item.pilot} (exit {item.code}): {said}")
    return no_outcome_error(item.code, directory.app_out, said)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
