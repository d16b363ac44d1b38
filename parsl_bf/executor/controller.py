"""The BackfillExecutor's decision core: every decision about pilots, fragments and tasks,
without I/O.

The :class:`Controller` holds what the executor knows (live pilots and their nodes, elastic
training tasks, plain tasks, the processes each fragment runs) and turns each batch of
:mod:`~parsl_bf.executor.lifecycle` events into commands for the executor's I/O shell to carry
out: :meth:`Controller.handle`. It has no clock: each batch comes with ``now``.

**One decision per batch.** Each event updates the state; then, if any event may have changed
the best allocation (a pilot came or went, a task arrived, a fragment or a plain app ended),
the allocator solves once (:class:`~parsl_bf.allocation.AllocatorSettings`, the same policy
object as the replay's), the counts are mapped to nodes without migration
(:func:`parsl_bf.allocation.plan`), and fragments are started, handed over or stopped.

**Pilots.** A a pilot that is preempted, cancelled or near its walltime is leaving: its
  fragments checkpoint now and its nodes are not offered again. "Near" is the walltime
  notice: ``walltime_notice_s`` until each task with a fragment on the pilot has stopped
  cleanly once (it or its family), then :data:`NOTICE_MARGIN` × their longest recent stop +
  :data:`NOTICE_SLACK_S` (capped at ``walltime_notice_s``), so that a hole is not cut short by
  more than its fragments need to checkpoint and exit (:meth:`Controller.next_deadline` says
  when to look again).
  At a walltime or a preemption, a fragment that also runs on pilots that stay gives the
  leaving pilot's ranks back in place instead (with ``shrink_in_place``): at a walltime its
  ranks there run until the shrink; at a preemption they got the agent's TERM at once and
  leave at their next step by themselves (the fragment's ``--leave-min``), so the shrink
  holds the preempted nodes no longer than a stop would. What a preemption costs is then
  the leaving ranks, not a restart of every rank. A pilot gone takes its processes with it:
  its plain apps are queued again, its fragments' launchers there count as lost.

Beyond the paper's model:
- a node's value is its pilot's remaining walltime: growing tasks take the longest-lived nodes,
  shrinking ones give back the shortest-lived, and a node whose pilot ends sooner than
  ``min_node_life_s`` (e.g. twice a rescale) is not offered to elastic tasks at all;
- scaling curves and rescale costs measured from the fragments' reports replace the user's
  guesses as soon as they exist.

Plain tasks (ordinary Parsl apps) take one node each, first come first served, before elastic
tasks are given the rest; elastic tasks do not grow while plain tasks wait for a node.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..allocation import DEFAULT_SETTINGS, Allocation, AllocatorSettings
from ..decisions import IN_PLACE_REASONS, PilotEnd
from .accounting import Accounting
from .allocating import Allocating
from .fragments import FragmentLifecycle, note_fields, renumbered, shrink_fields
from .lifecycle import (
    LAUNCH_FAILED,
    AppCrashed,
    Command,
    Evaluated,
    Event,
    Fail,
    FragmentReady,
    FragmentStarted,
    LaunchFailed,
    LogEvent,
    Note,
    Outlook,
    PilotGone,
    PilotLeaving,
    PilotUp,
    ProcessExited,
    Progress,
    Rescaled,
    Resolve,
    Signal,
    TaskSubmitted,
    Tick,
    WriteStatus,
    parse_key,
)
from .state import (
    MEASURED_KEPT,
    NOTICE_MARGIN,
    NOTICE_SLACK_S,
    START_MARGIN,
    ElasticTask,
    Fragment,
    Handover,
    PilotView,
    PlainTask,
    TaskState,
    node_id,
    split_node,
)

__all__ = [
    "Controller",
    "ElasticTask",
    "PlainTask",
    "PilotView",
    "Fragment",
    "node_id",
    "renumbered",
    "NOTICE_MARGIN",
    "NOTICE_SLACK_S",
    "START_MARGIN",
]

# Events after which the best allocation may differ: the batch ends with a decision.
_DECIDE_AFTER = (PilotUp, PilotLeaving, PilotGone, TaskSubmitted, ProcessExited)


class Controller(FragmentLifecycle, Allocating, Accounting):
    """Decisions of the BackfillExecutor; see the module docstring.

    Parameters, by keyword only
    ---------------------------
    allocator
        The settings (:class:`~parsl_bf.allocation.AllocatorSettings`; default
        :data:`~parsl_bf.allocation.DEFAULT_SETTINGS`, the executor's and the replay's): the
        allocation policy (method, objective, look-ahead, solver time limit; an ``auto``
        look-ahead is the median walltime of the pilots seen so far, i.e. of the holes), and
        whether fragments shrink and grow in place (``shrink_in_place``: only where every
        rank is an MPI job of its own, the executor's warm ranks: in one ``mpiexec`` world,
        MPICH keeps a rank that left until all have; module docstring).
    max_tasks
        Elastic tasks running at once (first come first served).
    min_node_life_s
        Nodes whose pilot ends sooner are not offered to elastic tasks (0: the paper's model).
    warm_rescale
        Hand a rescaled fragment over to its successor warm when the nodes allow (module
        docstring); False: always stop first, then start.
    walltime_notice_s
        A pilot this close to its end is leaving: its fragments checkpoint and stop. The
        most: once the tasks running there have stopped before, their own stop times set it
        (:data:`NOTICE_MARGIN`, module docstring).
    handover_timeout_s
        A warm successor not ready by then: its predecessor is stopped anyway (the successor
        takes over from the checkpoint whenever it is ready).
    stop_grace_s
        A fragment told to stop whose launchers have not all exited by then is killed.
    start_timeout_s
        A fragment whose ranks have not reported their first step this long after its start
        (or :data:`START_MARGIN` times the task's longest measured start, when longer) is
        stopped as a failed start: restarted, counted as a restart, or its task failed
        (a launcher that can never get its CPUs, ranks that cannot reach each other).
    max_restarts
        Fragments of a task restarted from its checkpoint after a failure that is not the
        task's own (a crashed rank, a lost node, out of memory) before its future fails, as
        torchrun's ``--max-restarts``. An exception in the task's code fails it at once.
    shared_cores
        The nodes are emulated on this many cores (the local emulation), so that a node is
        worth the share of a core its ranks get: the accounting measures that share (the
        ranks' CPU over wall seconds) and counts node-seconds at it (:meth:`efficiency`).
        None (real nodes): every node is a whole node.
    """

    def __init__(
        self,
        *,
        allocator: AllocatorSettings = DEFAULT_SETTINGS,
        max_tasks: int = 10,
        min_node_life_s: float = 0.0,
        warm_rescale: bool = True,
        walltime_notice_s: float = 5.0,
        handover_timeout_s: float = 120.0,
        stop_grace_s: float = 45.0,
        start_timeout_s: float = 120.0,
        max_restarts: int = 3,
        shared_cores: int | None = None,
    ) -> None:
        self.allocator = allocator
        self.shared_cores = shared_cores
        self.max_tasks, self.min_node_life_s = max_tasks, min_node_life_s
        self.warm_rescale = warm_rescale
        # Read once: the allocator may be wrapped later (benchmarks record its solves).
        self.shrink_in_place = allocator.shrink_in_place
        self.grow_in_place = allocator.grow_in_place
        self.walltime_notice_s = walltime_notice_s
        self.handover_timeout_s, self.stop_grace_s = handover_timeout_s, stop_grace_s
        self.start_timeout_s = start_timeout_s
        self.max_restarts = max_restarts
        self.pilots: dict[str, PilotView] = {}
        self.elastic: dict[str, ElasticTask] = {}
        self.plain: dict[str, PlainTask] = {}
        self.fragments: dict[tuple[str, int], Fragment] = {}  # (task, generation) → running
        # (task, successor generation) → the warm hand-over waiting for that successor
        self.handovers: dict[tuple[str, int], Handover] = {}
        self.last_allocation: Allocation | None = None
        self.solves = 0
        self.preemptions = 0
        self._outlook: Outlook | None = None  # the last one sent
        self.hole_lengths: list[float] = []
        # The run's accounting (docs/replay.md's metrics, measured): node-seconds offered by
        # pilots not leaving, node-seconds running tasks, and when it was last brought up to date.
        self.offered_node_s = self.used_node_s = 0.0
        self._accounted_at: float | None = None

    @property
    def effective_tfwd(self) -> float:
        return self.allocator.lookahead(self.hole_lengths)

    def handle(self, events: Sequence[Event], now: float) -> list[Command]:
        """Take a batch of events seen up to ``now``; return the commands, in order. One
        allocation decision at the end, if any event may have changed it."""
        self.account(now)
        out: list[Command] = []
        decide = False
        for event in events:
            decide |= self._on(event, now, out)
        if decide:
            self._decide(now, out)
        # A process the same batch reported exited, or lost with its pilot, needs no signal.
        running = {(p, k) for f in self.fragments.values() for k, p in f.running.items()}
        out = [c for c in out if not isinstance(c, Signal) or (c.pilot, c.key) in running]
        outlook = Outlook(self.outstanding_nodes(), self.next_deadline(), self.preemptions)
        if outlook != self._outlook:
            self._outlook = outlook
            out.append(outlook)
        # Each tick, and when a task settles: rewriting it after every batch costs more than
        # the decision itself at a thousand pilots.
        if any(isinstance(e, Tick) for e in events) or any(
            isinstance(c, Resolve | Fail) for c in out
        ):
            out.append(WriteStatus(self.status(now)))
        return out

    def _on(self, event: Event, now: float, out: list[Command]) -> bool:
        if isinstance(event, PilotUp):
            self.pilots[event.pilot] = PilotView(
                event.pilot, tuple(event.hosts), event.ends_at, gpus=event.gpus
            )
            if event.ends_at is not None:
                self.hole_lengths.append(max(1.0, event.ends_at - now))
        elif isinstance(event, PilotLeaving):
            view = self.pilots.get(event.pilot)
            if view is None or view.leaving:
                return False
            view.leaving = True
            self.preemptions += event.reason == PilotEnd.PREEMPTED
            self._stop_fragments_on(event.pilot, event.reason, now, out)
        elif isinstance(event, PilotGone):
            self._pilot_gone(event.pilot, now, out)
        elif isinstance(event, TaskSubmitted):
            task = event.task
            (self.elastic if isinstance(task, ElasticTask) else self.plain)[task.id] = task
        elif isinstance(event, ProcessExited | LaunchFailed):
            if isinstance(event, LaunchFailed):  # as a process that never ran, with why
                result = (False, event.error) if parse_key(event.key)[1] is None else None
                event = ProcessExited(event.pilot, event.key, LAUNCH_FAILED, result)
            task_id, generation, _group = parse_key(event.key)
            if generation is None:
                return self._plain_exited(task_id, event, out)
            return self._launcher_exited(
                task_id, generation, event.key, event.code, event.result, now, out
            )
        elif isinstance(event, Progress):
            self._started(event.task)
            self._progress(event)
        elif isinstance(event, Evaluated):
            task = self.elastic.get(event.task)
            if task is not None:
                task.metrics = {"samples": event.samples, **event.metrics}
        elif isinstance(event, FragmentStarted):
            task = self.elastic.get(event.task)
            if task is not None:
                self._started(task.id)
                task.last_reported = event.samples
                if task.resumed_samples is None:
                    task.resumed_samples = event.samples
                if task.redo_from is not None:  # the first step after a failure's restart
                    task.redone_samples += max(0, task.redo_from - event.samples)
                    task.redo_from = None
        elif isinstance(event, Rescaled):
            self._started(event.task)  # it trains at its new size
            task = self.elastic.get(event.task)
            if task is not None and event.in_place:
                task.last_reported = None  # the first report after it spans the resize
            if task is not None and event.in_place == "grow":
                self._grown(task, out)
            if task is not None and event.seconds >= 0:
                kept = {
                    "shrink": task.measured_shrink_s, "grow": task.measured_grow_s
                }.get(event.in_place, task.measured_rescale_s)  # fmt: skip
                kept.append(event.seconds)
                del kept[:-MEASURED_KEPT]
        elif isinstance(event, FragmentReady):
            handover = self.handovers.pop((event.task, event.generation), None)
            if handover is not None:
                self._stop(event.task, handover.previous, handover.reason, now, out)
        elif isinstance(event, Tick):
            return self._tick(now, out)
        return isinstance(event, _DECIDE_AFTER)

    # --- pilots -------------------------------------------------------------------------------

    def _stop_fragments_on(self, pilot: str, reason: str, now: float, out: list[Command]) -> None:
        """The pilot goes: every fragment with a node on it checkpoints now, except one that
        can give the pilot's ranks back in place when it leaves at its walltime or is
        preempted. At a walltime its ranks there run until then; at a preemption the agent
        has signalled them at once and, with their fragment's ``--leave-min``, they leave at
        their next step on their own (:class:`~parsl_bf.training.trainer.ElasticTrainer`):
        the shrink asked here is the same one, and whichever comes first is done. A pilot
        gone took its ranks with it: their fragment stops."""
        in_place = reason in IN_PLACE_REASONS
        for task in self.elastic.values():
            hit = task.state == TaskState.RUNNING and any(
                split_node(n)[0] == pilot for n in task.nodes
            )
            if hit and in_place and self._shrink_off(task, reason, now, out):
                continue
            if hit:
                task.state = TaskState.STOPPING
                self._stop(task.id, task.generation, reason, now, out)
            if task.previous is not None and (
                hit or any(split_node(n)[0] == pilot for n in task.previous[1])
            ):
                # Its successor is stopping or its own nodes go: no hand-over, stop it now.
                self._stop(task.id, task.previous[0], reason, now, out)

    def _shrink_off(self, task: ElasticTask, reason: str, now: float, out: list[Command]) -> bool:
        """Shrink ``task``'s running fragment in place onto its nodes whose pilots stay, if
        in-place shrinks are on and its placement allows: what a leaving pilot costs is then
        its own ranks, not a restart of every rank (a ResNet-18 shrink in place: 0.4 s)."""
        if task.previous is not None or task.releasing or self._joining(task):
            return False
        stays = [n for n in task.nodes if not self._leaving(split_node(n)[0])]
        if not self._trains_on(task, len(stays)):
            return False
        shrink = self._shrink(task, stays, now)
        if shrink is None:
            return False
        out += [shrink, Note(LogEvent.FRAGMENT_SHRINK, shrink_fields(shrink) | {"reason": reason})]
        return True

    def _leaving(self, pilot: str) -> bool:
        view = self.pilots.get(pilot)
        return view is None or view.leaving

    def _pilot_gone(self, pilot: str, now: float, out: list[Command]) -> None:
        """Its processes are gone: plain apps there run again (a preemption is not their
        failure), fragments there stop, and their launchers on it count as lost."""
        view = self.pilots.pop(pilot, None)
        if view is not None and not view.leaving:
            view.leaving = True
        self._stop_fragments_on(pilot, "pilot gone", now, out)
        for fragment in list(self.fragments.values()):
            for key in [k for k, p in fragment.running.items() if p == pilot]:
                self._launcher_exited(
                    fragment.task, fragment.generation, key, -9, None, now, out, lost=True
                )
        for task in self.plain.values():
            if task.state == TaskState.RUNNING and task.node and split_node(task.node)[0] == pilot:
                task.state, task.node = TaskState.QUEUED, None
                out.append(Note(LogEvent.TASK_REQUEUED, {"task": task.id, "reason": "pilot gone"}))

    def _tick(self, now: float, out: list[Command]) -> bool:
        """Deadlines: late hand-overs, stops not obeyed, pilots reaching their walltime."""
        for (task_id, successor), handover in list(self.handovers.items()):
            if now > handover.deadline or (task_id, successor) not in self.fragments:
                del self.handovers[(task_id, successor)]
                self._stop(task_id, handover.previous, handover.reason, now, out)
        for fragment in list(self.fragments.values()):
            late = fragment.shrink_deadline is not None and now > fragment.shrink_deadline
            if late and fragment.leaving:
                fragment.shrink_deadline = None  # not done in place: again at the new size
                self.elastic[fragment.task].state = TaskState.STOPPING
                self._stop(fragment.task, fragment.generation, "shrink not done", now, out)
            late = fragment.grow_deadline is not None and now > fragment.grow_deadline
            if late and fragment.joining:
                fragment.grow_deadline = None
                self.elastic[fragment.task].state = TaskState.STOPPING
                self._stop(fragment.task, fragment.generation, "grow not done", now, out)
            late = fragment.start_deadline is not None and now > fragment.start_deadline
            if late and fragment.stop_reason is None:
                fragment.start_deadline = None
                self._start_timed_out(fragment, now, out)
            if fragment.kill_at is not None and now > fragment.kill_at:
                fragment.kill_at = None
                out += [
                    Signal(p, k, "KILL") for k, p in fragment.running.items() if p in self.pilots
                ]
                out.append(Note(LogEvent.FRAGMENT_KILL, note_fields(fragment)))
        notices = self.notices()
        ending = [
            v.pilot
            for v in self.pilots.values()
            if not v.leaving and v.ends_at is not None and v.ends_at - now <= notices[v.pilot]
        ]
        for pilot in ending:
            out.append(Note(LogEvent.PILOT_ENDING, {"pilot": pilot}))
            self._on(PilotLeaving(pilot, "walltime"), now, out)
        return bool(ending)

    def notices(self) -> dict[str, float]:
        """How long before its walltime each pilot's fragments are told to stop (module
        docstring): what its tasks' recent clean stops took (for a task that has not stopped
        yet, its family's: the same training code), with a margin; the configured
        ``walltime_notice_s`` while one of them has no such stop, and at most."""
        tasks: dict[str, set[str]] = {}  # pilot → the tasks with a fragment there
        for f in self.fragments.values():
            for pilot in f.running.values():
                tasks.setdefault(pilot, set()).add(f.task)
        families: dict[str, list[float]] = {}  # a task that has not stopped yet: its family's
        for task in self.elastic.values():
            if task.family and task.stops_s:
                families.setdefault(task.family, []).extend(task.stops_s)
        out = {}
        for pilot in self.pilots:
            stops = [
                self.elastic[t].stops_s or families.get(self.elastic[t].family, [])
                for t in tasks.get(pilot, ())
                if t in self.elastic
            ]
            if stops and all(stops):
                learned = NOTICE_MARGIN * max(max(s) for s in stops) + NOTICE_SLACK_S
                out[pilot] = min(self.walltime_notice_s, learned)
            else:
                out[pilot] = self.walltime_notice_s
        return out

    def next_deadline(self) -> float | None:
        """The earliest time a pilot not yet leaving reaches its walltime notice (None: no
        pilot has a walltime), for the caller to come back with a :class:`Tick` then."""
        notices = self.notices()
        times = [
            v.ends_at - notices[v.pilot]
            for v in self.pilots.values()
            if not v.leaving and v.ends_at is not None
        ]
        return min(times, default=None)

    # --- plain tasks -------------------------------------------------------------------------

    def _plain_exited(self, task_id: str, event: ProcessExited, out: list[Command]) -> bool:
        """A plain app's process exited: its outcome sets its future; without one it runs
        again, unless it died on a pilot that stays more than ``max_restarts`` times."""
        task = self.plain.get(task_id)
        if (
            task is None
            or task.state != TaskState.RUNNING
            or split_node(task.node or "")[0] != event.pilot
        ):
            return False  # a stale report: the task was queued again when its pilot went
        task.node = None
        task.crashes += event.result is None and not self._leaving(event.pilot)
        if event.result is None and task.crashes <= self.max_restarts:
            # Killed with its pilot (not its own error), or not yet crashed too often: again.
            task.state = TaskState.QUEUED
            out.append(Note(LogEvent.TASK_REQUEUED, {"task": task_id, "code": event.code}))
            return True
        if event.result is None:  # it keeps dying on pilots that stay: fail, do not loop
            why = f"exit {event.code} without an outcome, {task.crashes} times on live pilots"
            ok, value = False, AppCrashed(why)
        else:
            ok, value = event.result
        task.state = TaskState.DONE
        out.append(Resolve(task_id, value) if ok else Fail(task_id, value))
        out.append(Note(LogEvent.TASK_DONE, {"task": task_id, "ok": ok}))
        return True
