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

**The fragment lifecycle.**

- *Start*: :class:`StartFragment` with one launcher per pilot; the controller records the
  fragment's process keys and waits for each to exit.
- *Warm rescale*, when every node the new size adds is free: the successor starts at once
  (sharing the kept nodes with the old ranks for a moment) and builds its model while the old
  fragment keeps training; at :class:`FragmentReady` (or at the hand-over deadline, or when the
  successor ends first) the old one is told to checkpoint and exit, and the successor takes
  over from its result. Otherwise (nodes still held by another task, or
  ``warm_rescale=False``) it is *cold*: stop, then start the new size at the decision after
  the stop.
- *Shrink in place* (``shrink_in_place`` of the settings), when a running fragment keeps part
  of its nodes and the nodes it gives back are whole launchers (pilots):
  :class:`ShrinkFragment`. Its kept ranks train on in memory and the others leave
  (:mod:`parsl_bf.training.resize`); the nodes given back stay busy until their launchers
  have exited. Not done by then (``handover_timeout_s``), or not possible in place (the
  trainer stops instead), the fragment stops and starts again at the new size.
- *Grow in place* (``grow_in_place`` of the settings), when a running fragment keeps all of its
  nodes and adds free ones: :class:`GrowFragment`. Joiner launchers start on the added nodes
  (one per pilot, new placement groups of the same fragment); once they are set up the shell
  writes the grow request, and at its next step the fragment takes them in and sends them
  its state. Not
  done by ``handover_timeout_s`` (a joiner that failed, a grow the trainer refused), the
  fragment stops and starts again at the new size. Nodes another task gives back at the
  same decision are busy until its ranks there have left: the grow waits for them (their
  exit brings a decision) while the fragment trains on, instead of stopping to start again.
- *Which* resizes are done in place is one rule, :func:`parsl_bf.decisions.trains_on_in_place`
  (a shrink, and a fragment that loses a leaving pilot's nodes: at least ``min_nodes`` stay)
  and :func:`parsl_bf.decisions.grows_in_place`, the same rule the ranks (their
  ``--leave-min``) and the replay follow. A task that answered an in-place shrink or grow by
  stopping (its result says it runs a loop of its own, :mod:`parsl_bf.training.elastic`,
  which cannot resize in place) is marked (``ElasticTask.resizes_in_place`` False): from then
  on it is neither asked to resize in place nor sent joiners, and the allocator weighs its
  resizes at its restart's cost.
- *Stop*: ``TERM`` to each of the fragment's launchers; ``KILL`` to what is left after
  ``stop_grace_s`` (ranks blocked on a peer that died with its pilot).
- *Exit classification*, when a fragment's last process has exited: its result says ``done``
  (the task's future resolves), or ``stopped``, or it was asked to stop, or its processes were
  lost with a pilot: it continues from its checkpoint at the next decision. A fragment that a
  successor supersedes and that left no result is marked lost (:class:`MarkLost`) so that the
  successor takes over from the last checkpoint. Anything else is a failure of the task. When
  one launcher of several ends alone, the others are stopped. A launcher that never ran (its
  launch failed: :func:`~parsl_bf.executor.lifecycle.launch_failed`) or that exited non-zero
  on a pilot that stays before anything asked it to stop (a crashed rank) makes the
  fragment's end a failure even so, counted against ``max_restarts``: a start or a rank that
  fails again and again (a full disk, a bad node) fails the task instead of restarting it
  forever. A plain app that exits without an outcome on a pilot that stays (killed by the
  kernel, a crash of the interpreter) runs again at most ``max_restarts`` times, then fails.
- *Pilots*: a pilot that is preempted, cancelled or near its walltime is leaving: its
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

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..allocation import (
    DEFAULT_SETTINGS,
    Allocation,
    AllocationProblem,
    AllocatorSettings,
    TaskSpec,
    plan,
)
from ..decisions import IN_PLACE_REASONS, grows_in_place, trains_on_in_place
from .lifecycle import (
    E_SLACK,
    LAUNCH_FAILED,
    AppCrashed,
    Command,
    Evaluated,
    Event,
    Fail,
    FragmentOver,
    FragmentReady,
    FragmentStarted,
    GrowFragment,
    LaunchFailed,
    MarkLost,
    Note,
    Outlook,
    PilotGone,
    PilotLeaving,
    PilotUp,
    Placement,
    ProcessExited,
    Progress,
    RankGroup,
    Rescaled,
    Resolve,
    RunPlain,
    ShrinkFragment,
    Signal,
    Solved,
    StartFragment,
    TaskSubmitted,
    Tick,
    WriteStatus,
    fragment_key,
    launch_failed,
    parse_key,
)

__all__ = [
    "Controller",
    "ElasticTask",
    "PlainTask",
    "PilotView",
    "Fragment",
    "node_id",
    "renumbered",
]

# A node is named "<pilot>/<host>": the same host may come back in another pilot.
Node = str

# Step rates kept per task and world size (the latest): recent enough, and bounded memory.
MEASURED_KEPT = 100
#: A pilot's walltime notice, once each task with a fragment on it has stopped cleanly
#: before: this many times the longest of their recent stops (TERM → exit seen here)...
NOTICE_MARGIN = 2.0
#: ...plus this (the decision's and the messages' latency), never above ``walltime_notice_s``.
#: A stop still under way at the walltime loses nothing: the scheduler's own TERM and grace
#: follow (Slurm's ``signal_lead_s`` + 5 s, the emulation's ``grace_s``).
NOTICE_SLACK_S = 0.25
#: Clean stops remembered per task: a slower stop raises the notice for this many stops.
STOPS_KEPT = 10
#: A fragment's start may take this many times the task's longest measured start (a start on
#: a loaded node is slower, a launch that cannot start never ends) before it counts as failed.
START_MARGIN = 4.0


def node_id(pilot: str, host: str) -> Node:
    return f"{pilot}/{host}"


@dataclass
class PilotView:
    """A live pilot: its nodes, when it ends, whether it is leaving (preempted, ending)."""

    pilot: str
    hosts: tuple[str, ...]
    ends_at: float | None
    leaving: bool = False
    gpus: int = 0  # on each node

    @property
    def ranks_per_node(self) -> int:
        """A fragment's ranks on each of its nodes: one per GPU, one on CPU nodes."""
        return max(1, self.gpus)

    @property
    def nodes(self) -> list[Node]:
        return [node_id(self.pilot, h) for h in self.hosts]


@dataclass
class ElasticTask:
    """An elastic training task: ``work`` samples of ``task`` (module:function) on
    ``min_nodes``..``max_nodes`` nodes."""

    id: str
    work: int
    min_nodes: int = 1
    max_nodes: int = 1
    task: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    family: str = ""  # the training code (module:function): tasks of a family share rates
    # False once a fragment of it answered an in-place shrink or grow by stopping (a loop of
    # its own, parsl_bf.training.elastic): it is not asked to resize in place again.
    resizes_in_place: bool = True
    scaling: dict[int, float] = field(default_factory=dict)  # the user's guess, samples/s
    rescale_s: float = 10.0  # the user's guess of a rescale's cost
    samples: int = 0
    nodes: tuple[Node, ...] = ()  # the running fragment's nodes
    generation: int = 0  # fragments started so far
    state: str = "queued"  # queued, running, stopping, done, failed
    # The previous fragment (generation, nodes) while it hands over to the current one: its
    # nodes stay busy, and the task is not rescaled again, until it has exited.
    previous: tuple[int, tuple[Node, ...]] | None = None
    # Nodes an in-place shrink gave back: busy until the ranks there have left.
    releasing: tuple[Node, ...] = ()
    measured: dict[int, list[float]] = field(default_factory=dict)  # world → samples/s
    # The samples and the seconds of the step reports at one node, over the whole run: the
    # accounting's P(1) is their ratio (see :meth:`Controller.efficiency`).
    # On the emulation those seconds are scaled to a node with a core of its own.
    one_node_samples: float = 0.0
    one_node_s: float = 0.0
    node_s: float = 0.0  # node-seconds its fragments held
    # Emulation only: the node-seconds of its step reports' spans, and the same × the CPU
    # share its rank 0 got there (what those nodes were worth; Controller.efficiency).
    report_node_s: float = 0.0
    report_capacity_s: float = 0.0
    # The samples of the running fragment's last report (or its first step), which the next
    # report's rate spans; None until the first step after a start or a resize in place.
    last_reported: int | None = None
    measured_rescale_s: list[float] = field(default_factory=list)
    measured_shrink_s: list[float] = field(default_factory=list)  # in-place shrinks
    measured_grow_s: list[float] = field(default_factory=list)  # in-place grows
    stops_s: list[float] = field(default_factory=list)  # clean stops: TERM → last exit, s
    metrics: dict[str, Any] | None = None  # the latest evaluation, for parsl-bf status
    resolved: bool = False  # its future has its result (or error)
    restarts: int = 0  # fragments restarted after a failure (a crashed rank, a lost node)
    redone_samples: int = 0  # samples trained again because of those failures
    resumed_samples: int | None = None  # done before this run first started it (a rerun)
    redo_from: int | None = None  # samples reached when the last failure struck

    def curve(
        self, siblings: Mapping[int, list[float]] | None = None
    ) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Samples/s at 0..max_nodes: measured where known, else the user's guess, else
        linear from the best measured (or assumed 1 sample/s) rate per node. A task with
        neither measurements nor a guess takes ``siblings``' (rates measured on tasks running
        the same training code) rather than the 1 sample/s that would starve it."""
        known = {n: statistics.median(r) for n, r in self.measured.items() if r}
        if not known and not self.scaling and siblings:
            known = {n: statistics.median(r) for n, r in siblings.items() if r}
        per_node = max((v / n for n, v in known.items()), default=None)
        if per_node is None:
            guesses = {n: v for n, v in self.scaling.items() if n > 0}
            per_node = max((v / n for n, v in guesses.items()), default=1.0)
        rates = []
        for n in range(1, self.max_nodes + 1):
            rate = known.get(n, self.scaling.get(n, per_node * n))
            rates.append(max(rate, rates[-1] if rates else 0.0))  # never less with more nodes
        return tuple(range(self.max_nodes + 1)), (0.0, *rates)

    def left(self) -> float:
        """Samples still to train, as the allocator weighs them: at least one until the task
        has its result. Step reports may reach the work before a fragment has written the
        result (its pilot gone, a rank crashed): a successor must still run to return it (from
        the final checkpoint it ends at once). At 0 it would get no nodes, and its future would
        never resolve."""
        return max(0.0 if self.resolved else 1.0, float(self.work - self.samples))

    def held(self) -> set[Node]:
        """The nodes its fragments occupy: the current one's, a handing-over one's and those
        an in-place shrink is giving back."""
        nodes = set(self.nodes) if self.state in ("running", "stopping") else set()
        nodes |= set(self.releasing)
        return nodes | set(self.previous[1]) if self.previous is not None else nodes

    def rescale_cost(self) -> float:
        return (
            statistics.median(self.measured_rescale_s)
            if self.measured_rescale_s
            else self.rescale_s
        )

    def shrink_cost(self) -> float:
        """A shrink's cost: in place as measured, else as any rescale."""
        if self.measured_shrink_s:
            return statistics.median(self.measured_shrink_s)
        return self.rescale_cost()

    def grow_cost(self) -> float:
        """A grow's cost: in place as measured, else as any rescale."""
        if self.measured_grow_s:
            return statistics.median(self.measured_grow_s)
        return self.rescale_cost()


@dataclass
class PlainTask:
    """An ordinary Parsl app: one process on one node."""

    id: str
    node: Node | None = None
    state: str = "queued"  # queued, running, done
    attempts: int = 0
    # Times it exited without an outcome on a pilot that stays (not its pilot's end)
    crashes: int = 0


@dataclass
class Fragment:
    """A fragment whose launchers have not all exited yet."""

    task: str
    generation: int
    running: dict[str, str]  # process key → pilot, until it exits or is lost
    result: dict[str, Any] | None = None  # the latest result.json seen at an exit
    stop_reason: str | None = None  # why it was told to stop (TERM sent), None: not told
    stopped_at: float | None = None  # when it was told
    kill_at: float | None = None  # KILL what is left then
    lost: bool = False  # a launcher went with its pilot
    code: int = 0  # the first non-zero exit code
    placement: Placement = ()  # as started: launcher g runs the hosts of placement[g]
    # launcher g's ranks as numbered now: (first rank, ranks); a shrink renumbers them
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    leaving: set[str] = field(default_factory=set)  # launchers an in-place shrink lets go
    shrink_deadline: float | None = None  # stop it if they have not all left by then
    joining: set[str] = field(default_factory=set)  # joiner launchers of an in-place grow
    resized_in_place: bool = False  # it was asked to shrink or grow in place
    grow_deadline: float | None = None  # stop it if it has not grown by then
    # A launcher failed on its own (it never ran, or it exited non-zero on a pilot that stays
    # before anything asked it to stop): the fragment's end is a failure, not a stop, even
    # though its other launchers were then stopped.
    failed: bool = False
    # Its ranks have not all reported their first step: stop it as a failed start if they
    # have not by then (None: started).
    start_deadline: float | None = None
    why_failed: str = ""  # what a failure was, when not an exit code (a start that timed out)


@dataclass
class _Handover:
    """A warm successor's predecessor, to stop once the successor is ready (or at deadline)."""

    previous: int  # the generation to stop
    reason: str
    deadline: float


def _split(node: Node) -> tuple[str, str]:
    pilot, _, host = node.rpartition("/")
    return pilot, host


# Events after which the best allocation may differ: the batch ends with a decision.
_DECIDE_AFTER = (PilotUp, PilotLeaving, PilotGone, TaskSubmitted, ProcessExited)


class Controller:
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
        self.handovers: dict[tuple[str, int], _Handover] = {}
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

    # --- the one entry point ----------------------------------------------------------------

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
            self.preemptions += event.reason == "preempted"
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

    # --- pilots -----------------------------------------------------------------------------

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
            hit = task.state == "running" and any(_split(n)[0] == pilot for n in task.nodes)
            if hit and in_place and self._shrink_off(task, reason, now, out):
                continue
            if hit:
                task.state = "stopping"
                self._stop(task.id, task.generation, reason, now, out)
            if task.previous is not None and (
                hit or any(_split(n)[0] == pilot for n in task.previous[1])
            ):
                # Its successor is stopping or its own nodes go: no hand-over, stop it now.
                self._stop(task.id, task.previous[0], reason, now, out)

    def _shrink_off(self, task: ElasticTask, reason: str, now: float, out: list[Command]) -> bool:
        """Shrink ``task``'s running fragment in place onto its nodes whose pilots stay, if
        in-place shrinks are on and its placement allows: what a leaving pilot costs is then
        its own ranks, not a restart of every rank (a ResNet-18 shrink in place: 0.4 s)."""
        if task.previous is not None or task.releasing or self._joining(task):
            return False
        stays = [n for n in task.nodes if not self._leaving(_split(n)[0])]
        if not self._trains_on(task, len(stays)):
            return False
        shrink = self._shrink(task, stays, now)
        if shrink is None:
            return False
        out += [shrink, Note("fragment_shrink", _shrink_names(shrink) | {"reason": reason})]
        return True

    def _trains_on(self, task: ElasticTask, staying: int) -> bool:
        """Whether ``task``'s running fragment keeps training in place on ``staying`` of its
        nodes, the others leaving (:func:`~parsl_bf.decisions.trains_on_in_place`)."""
        return trains_on_in_place(
            staying,
            len(task.nodes) - staying,
            task.min_nodes,
            enabled=self.shrink_in_place,
            task_resizes=task.resizes_in_place,
        )

    def _shrinks_in_place(self, task: ElasticTask) -> bool:
        """Whether ``task``'s fragments are to let ranks leave in place at all: what their
        ranks' ``--leave-min`` follows (the executor gives it to those that do)."""
        return self.shrink_in_place and task.resizes_in_place

    def _grows(self, task: ElasticTask, adding: int) -> bool:
        """Whether ``task``'s running fragment, keeping all its nodes, takes ``adding`` more in
        place (:func:`~parsl_bf.decisions.grows_in_place`)."""
        return grows_in_place(
            len(task.nodes),
            adding,
            enabled=self.grow_in_place,
            task_resizes=task.resizes_in_place,
        )

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
            if task.state == "running" and task.node and _split(task.node)[0] == pilot:
                task.state, task.node = "queued", None
                out.append(Note("task_requeued", {"task": task.id, "reason": "pilot gone"}))

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
                self.elastic[fragment.task].state = "stopping"
                self._stop(fragment.task, fragment.generation, "shrink not done", now, out)
            late = fragment.grow_deadline is not None and now > fragment.grow_deadline
            if late and fragment.joining:
                fragment.grow_deadline = None
                self.elastic[fragment.task].state = "stopping"
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
                out.append(Note("fragment_kill", _names(fragment)))
        notices = self.notices()
        ending = [
            v.pilot
            for v in self.pilots.values()
            if not v.leaving and v.ends_at is not None and v.ends_at - now <= notices[v.pilot]
        ]
        for pilot in ending:
            out.append(Note("pilot_ending", {"pilot": pilot}))
            self._on(PilotLeaving(pilot, "walltime"), now, out)
        return bool(ending)

    def _started(self, task_id: str) -> None:
        """The task's ranks train: no start of its is late (reports name no generation)."""
        for fragment in self.fragments.values():
            if fragment.task == task_id:
                fragment.start_deadline = None

    def start_timeout(self, task: ElasticTask) -> float:
        """How long ``task``'s fragment may take from its start to its first step: the
        configured floor, or :data:`START_MARGIN` times its longest measured start."""
        return max(self.start_timeout_s, START_MARGIN * max(task.measured_rescale_s, default=0))

    def _start_timed_out(self, fragment: Fragment, now: float, out: list[Command]) -> None:
        """Its ranks never all reported: stop the launch as a failed one (a restart, or the
        task's failure once it has none left), naming where it ran."""
        task = self.elastic[fragment.task]
        where = "; ".join(f"pilot {p} hosts {','.join(h)}" for p, h in fragment.placement)
        fragment.failed = True
        fragment.why_failed = (
            f"its ranks had not started training {self.start_timeout(task):.0f} s after "
            f"the launch ({where})"
        )
        out.append(Note("fragment_start_timeout", _names(fragment) | {"where": where}))
        self._stop(task.id, fragment.generation, "start timed out", now, out)

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

    # --- fragments --------------------------------------------------------------------------

    def _start(
        self, task: ElasticTask, nodes: Sequence[Node], after: int | None, now: float
    ) -> StartFragment:
        task.nodes, task.generation = tuple(nodes), task.generation + 1
        groups = self._rank_groups(_placement(nodes), 0)
        start = StartFragment(
            task.id, task.generation, groups, after, self._leave_min(task, groups)
        )
        self.fragments[(task.id, task.generation)] = Fragment(
            task.id,
            task.generation,
            {fragment_key(task.id, task.generation, g): r.pilot for g, r in enumerate(groups)},
            placement=start.placement,
            ranges={g: (r.first, r.count) for g, r in enumerate(groups)},
            # A warm successor's first step waits for its predecessor's stop, which waits for
            # the successor's readiness at most the hand-over's timeout.
            start_deadline=now
            + self.start_timeout(task)
            + (self.handover_timeout_s if after is not None else 0.0),
        )
        return start

    def _shrink(self, task: ElasticTask, nodes: Sequence[Node], now: float) -> Command | None:
        """An in-place shrink of ``task``'s running fragment to ``nodes``, if its placement
        allows one: the nodes given back are whole launchers."""
        fragment = self.fragments.get((task.id, task.generation))
        if fragment is None or fragment.stop_reason is not None or fragment.leaving:
            return None
        kept = set(nodes)
        keep, leave = [], []
        for g, (pilot, hosts) in enumerate(fragment.placement):
            held = [node_id(pilot, h) in kept for h in hosts]
            if all(held):
                keep.append(g)
            elif any(held):
                return None  # some of a launcher's ranks: it could not report their exit
            else:
                leave.append(g)
        if not keep or not leave or len(kept) != sum(len(fragment.placement[g][1]) for g in keep):
            return None
        gone = {fragment_key(task.id, task.generation, g) for g in leave}
        fragment.leaving = gone & set(fragment.running)
        fragment.shrink_deadline = now + self.handover_timeout_s
        fragment.resized_in_place = True
        task.releasing = tuple(n for n in task.nodes if n not in kept)
        task.nodes = tuple(n for n in task.nodes if n in kept)
        ranks, of, fragment.ranges = renumbered(fragment.ranges, tuple(keep))
        return ShrinkFragment(task.id, task.generation, tuple(keep), ranks, of)

    def _grow(self, task: ElasticTask, nodes: Sequence[Node], now: float) -> GrowFragment | None:
        """An in-place grow of ``task``'s running fragment to ``nodes`` (all of its own and
        more): joiner launchers on the added nodes, one per pilot."""
        fragment = self.fragments.get((task.id, task.generation))
        if fragment is None or fragment.stop_reason is not None:
            return None
        if fragment.leaving or fragment.joining or not set(task.nodes) <= set(nodes):
            return None
        placement = _placement(n for n in nodes if n not in set(task.nodes))
        first = len(fragment.placement)  # groups are never renumbered: keys stay unique
        world = sum(count for _, count in fragment.ranges.values())
        groups = self._rank_groups(placement, world)  # numbered in the grown fragment
        fragment.ranges |= {first + i: (r.first, r.count) for i, r in enumerate(groups)}
        keys = {
            fragment_key(task.id, task.generation, first + i): pilot
            for i, (pilot, _) in enumerate(placement)
        }
        fragment.running.update(keys)
        fragment.placement += placement
        fragment.joining, fragment.grow_deadline = set(keys), now + self.handover_timeout_s
        fragment.resized_in_place = True
        task.nodes = tuple(nodes)
        leave_min = self._leave_min(task, groups)
        return GrowFragment(task.id, task.generation, groups, first, world, leave_min)

    def _rank_groups(self, placement: Placement, first: int) -> tuple[RankGroup, ...]:
        """The ranks of one launcher per ``placement`` group, numbered from ``first``."""
        groups = []
        for pilot, hosts in placement:
            view = self.pilots.get(pilot)
            per = view.ranks_per_node if view is not None else 1
            groups.append(RankGroup(pilot, hosts, first, len(hosts) * per, per))
            first += len(hosts) * per
        return tuple(groups)

    def _leave_min(self, task: ElasticTask, groups: Sequence[RankGroup]) -> int | None:
        """The ranks' side of :meth:`_trains_on` (:func:`~parsl_bf.decisions
        .trains_on_in_place` on ranks instead of nodes): the ranks of ``min_nodes`` nodes,
        for the fragments of a task that shrinks in place; None for the others."""
        if not self._shrinks_in_place(task):
            return None
        return task.min_nodes * max(g.per_node for g in groups)

    def _grown(self, task: ElasticTask, out: list[Command]) -> None:
        """The task's fragment took its first step with its joiners."""
        fragment = self.fragments.get((task.id, task.generation))
        if fragment is not None and fragment.joining:
            fragment.joining, fragment.grow_deadline = set(), None
            out.append(Note("fragment_grown", _names(fragment) | {"nodes": len(task.nodes)}))

    def _joining(self, task: ElasticTask) -> bool:
        """An in-place grow of the task's fragment is under way."""
        fragment = self.fragments.get((task.id, task.generation))
        return fragment is not None and bool(fragment.joining)

    def _stop(
        self, task_id: str, generation: int, reason: str, now: float, out: list[Command]
    ) -> None:
        """Tell a fragment to checkpoint and exit (once)."""
        fragment = self.fragments.get((task_id, generation))
        if fragment is None or fragment.stop_reason is not None:
            return
        fragment.stop_reason, fragment.kill_at = reason, now + self.stop_grace_s
        fragment.stopped_at = now
        for key in [
            k for k, h in self.handovers.items() if h.previous == generation and k[0] == task_id
        ]:
            del self.handovers[key]  # stopped now: nothing to wait for
        out += [Signal(p, k, "TERM") for k, p in fragment.running.items() if p in self.pilots]
        out.append(Note("fragment_stop", _names(fragment) | {"reason": reason}))

    def _launcher_exited(
        self,
        task_id: str,
        generation: int,
        key: str,
        code: int,
        result: dict[str, Any] | None,
        now: float,
        out: list[Command],
        lost: bool = False,
    ) -> bool:
        """One launcher of a fragment has exited (or was lost with its pilot)."""
        fragment = self.fragments.get((task_id, generation))
        if fragment is None or key not in fragment.running:
            return False  # a stale or repeated report
        pilot = fragment.running.pop(key)
        fragment.joining.discard(key)  # a joiner that ended before it joined: see below
        if key in fragment.leaving:
            fragment.leaving.discard(key)
            if code == 0 and not lost:  # its ranks left as asked: their nodes are free
                task = self.elastic[task_id]
                task.releasing = tuple(n for n in task.releasing if _split(n)[0] != pilot)
                if not fragment.leaving:
                    fragment.shrink_deadline = None
                    out.append(
                        Note("fragment_shrunk", _names(fragment) | {"nodes": len(task.nodes)})
                    )
                if fragment.running:
                    return True
        fragment.result = result if result is not None else fragment.result
        fragment.lost |= lost
        fragment.code = fragment.code or code
        # Its others are then stopped, but that stop does not make the end a clean one.
        unasked = fragment.stop_reason is None and not self._leaving(pilot)
        fragment.failed |= not lost and (launch_failed(code) or (unasked and code != 0))
        if fragment.running:
            # A launcher ended alone: the others cannot go on without its ranks.
            self._stop(task_id, generation, "a group ended", now, out)
            return False
        del self.fragments[(task_id, generation)]
        out.append(FragmentOver(task_id, generation))
        self._fragment_ended(fragment, now, out)
        return True

    def _fragment_ended(self, fragment: Fragment, now: float, out: list[Command]) -> None:
        """All launchers of a fragment exited: classify the exit."""
        task = self.elastic[fragment.task]
        result = fragment.result
        status = result.get("status") if result else None
        samples = int(result.get("samples", 0)) if result else 0
        names = _names(fragment)
        if task.resumed_samples is None and result and "loaded_samples" in result:
            # It ended before its first step (the checkpoint it found was the last).
            task.resumed_samples = int(result["loaded_samples"])
        if fragment.generation != task.generation:  # superseded by a warm successor
            if result is None:
                # It died: the successor, waiting for its result, takes over from the last
                # checkpoint as after a preemption.
                out += [
                    Note("fragment_lost", names | {"code": fragment.code}),
                    MarkLost(task.id, fragment.generation),
                ]
            elif status == "done":
                # It finished the work before its successor took over: that is the task's
                # result (the successor finds the final checkpoint and ends at once).
                self._resolve(task, result, out)
            else:
                out.append(Note("fragment_stopped", names | {"samples": samples}))
            self._ended(task, fragment.generation, "stopped", samples, now, out)
        elif status == "error":  # the task's own code raised: not worth a restart
            self._fail(task, str(result.get("error") or "error"), None, out)
            self._ended(task, fragment.generation, "failed", samples, now, out)
        elif status == "done":
            self._resolve(task, result, out)
            self._ended(task, fragment.generation, "done", samples, now, out)
        elif not fragment.failed and (
            status == "stopped" or fragment.stop_reason is not None or fragment.lost
        ):
            if status == "stopped" and fragment.resized_in_place and not _resizes(result):
                # It answered an in-place resize by stopping, and says it always will (a loop
                # of its own): from now on it is resized by a restart only.
                task.resizes_in_place = False
                out.append(Note("task_resizes_by_restart", names))
            if status == "stopped" and fragment.stopped_at is not None and not fragment.lost:
                task.stops_s.append(now - fragment.stopped_at)
                del task.stops_s[:-STOPS_KEPT]
            out.append(Note("fragment_stopped", names | {"samples": samples}))
            self._ended(task, fragment.generation, "stopped", samples, now, out)
        elif task.restarts < self.max_restarts:
            # A crash (a rank killed, out of memory, a node lost, a launch that failed): again
            # from the checkpoint.
            task.restarts += 1
            task.redo_from = max(task.redo_from or 0, task.samples)
            failed = names | {"code": fragment.code, "restarts": task.restarts}
            if fragment.why_failed:
                failed["why"] = fragment.why_failed
            out.append(Note("fragment_failed", failed))
            self._ended(task, fragment.generation, "stopped", samples, now, out)
        else:
            why = fragment.why_failed or f"exit {fragment.code}"
            why = f"{why} after {task.restarts} restarts"
            self._fail(task, why, fragment.generation, out)
            self._ended(task, fragment.generation, "failed", samples, now, out)

    def _fail(self, task: ElasticTask, error: str, generation: int | None, out) -> None:
        out.append(Note("task_failed", {"task": task.id, "error": error.splitlines()[-1:]}))
        out.append(Fail(task.id, error, generation))
        task.resolved = True

    def _resolve(self, task: ElasticTask, result: dict[str, Any], out: list[Command]) -> None:
        """A task's result, once: a predecessor and its successor may both end done."""
        if not task.resolved:
            task.resolved = True
            result = result | {
                "restarts": task.restarts,
                "redone_samples": task.redone_samples,
                "resumed_samples": task.resumed_samples or 0,
            }
            out += [
                Resolve(task.id, result),
                Note("task_done", {"task": task.id, "samples": result.get("samples")}),
            ]

    def _ended(
        self,
        task: ElasticTask,
        generation: int,
        status: str,
        samples: int,
        now: float,
        out: list[Command],
    ) -> None:
        task.samples = max(task.samples, samples)
        if task.previous is not None and generation == task.previous[0]:
            task.previous = None  # handed over (or stopped): its nodes are free
            if task.state == "stopping" and not task.nodes:
                task.state = "queued"
            if task.state == "queued" and task.resolved:
                # It finished the work after its successor had already ended: nothing is left.
                task.state = "done"
            return
        if generation != task.generation:
            return
        task.nodes, task.releasing = (), ()
        task.state = {"done": "done", "failed": "failed"}.get(status, "queued")
        if task.state == "queued" and task.resolved:
            # A predecessor finished the work during a hand-over: nothing is left to train.
            # Reports that reached the work are not enough (see ElasticTask.left).
            task.state = "done"
        if task.previous is not None:
            # The successor ended before the hand-over: the previous fragment must stop
            # before the task may start again (two fragments would share one checkpoint).
            self.handovers.pop((task.id, generation), None)
            self._stop(task.id, task.previous[0], "successor ended", now, out)
            if task.state == "queued":
                task.state = "stopping"

    def _progress(self, event: Progress) -> None:
        """A fragment's step report: learn its scaling curve."""
        task = self.elastic.get(event.task)
        if task is not None and event.rate > 0:
            rates = task.measured.setdefault(event.world, [])
            rates.append(event.rate)
            del rates[:-MEASURED_KEPT]
            task.samples = max(task.samples, event.samples)
            last, task.last_reported = task.last_reported, event.samples
            if last is None or event.samples <= last:
                return
            seconds = (event.samples - last) / event.rate
            share = 1.0
            if self.shared_cores is not None and event.cpu_share is not None:
                share = min(1.0, max(event.cpu_share, 1e-3))
                task.report_node_s += seconds * event.world  # rank 0 stands for every rank
                task.report_capacity_s += seconds * event.world * share
            if event.world == 1:
                task.one_node_samples += event.samples - last
                # with a core of its own, these samples would have taken this share of the time
                task.one_node_s += seconds * share

    # --- plain tasks ------------------------------------------------------------------------

    def _plain_exited(self, task_id: str, event: ProcessExited, out: list[Command]) -> bool:
        """A plain app's process exited: its outcome sets its future; without one it runs
        again, unless it died on a pilot that stays more than ``max_restarts`` times."""
        task = self.plain.get(task_id)
        if task is None or task.state != "running" or _split(task.node or "")[0] != event.pilot:
            return False  # a stale report: the task was queued again when its pilot went
        task.node = None
        task.crashes += event.result is None and not self._leaving(event.pilot)
        if event.result is None and task.crashes <= self.max_restarts:
            # Killed with its pilot (not its own error), or not yet crashed too often: again.
            task.state = "queued"
            out.append(Note("task_requeued", {"task": task_id, "code": event.code}))
            return True
        if event.result is None:  # it keeps dying on pilots that stay: fail, do not loop
            why = f"exit {event.code} without an outcome, {task.crashes} times on live pilots"
            ok, value = False, AppCrashed(why)
        else:
            ok, value = event.result
        task.state = "done"
        out.append(Resolve(task_id, value) if ok else Fail(task_id, value))
        out.append(Note("task_done", {"task": task_id, "ok": ok}))
        return True

    # --- accounting -------------------------------------------------------------------------

    def node_capacity(self) -> float:
        """What a node in use was worth, of a node with a core of its own: 1 on real nodes;
        on the emulation the mean share of a core the ranks got (CPU ÷ wall seconds over the
        step reports so far, 1 before the first)."""
        wall = sum(t.report_node_s for t in self.elastic.values())
        if self.shared_cores is None or wall <= 0:
            return 1.0
        return sum(t.report_capacity_s for t in self.elastic.values()) / wall

    def account(self, now: float) -> None:
        """Add the node-seconds since the last call (call at every event and tick)."""
        if self._accounted_at is not None and now > self._accounted_at:
            dt = now - self._accounted_at
            offered = sum(len(v.hosts) for v in self.pilots.values() if not v.leaving)
            used = sum(1 for t in self.plain.values() if t.state == "running")
            for task in self.elastic.values():
                n = len(task.held())
                task.node_s += dt * n
                used += n
            self.offered_node_s += dt * offered
            self.used_node_s += dt * min(used, offered) if offered else 0.0
        self._accounted_at = now

    def efficiency(self) -> dict[str, Any]:
        """util, E_used and E_avail of the run so far: samples_j / P_j(1) as in the replay, in
        node-seconds.

        P_j(1) is task j's one-node rate averaged over time (the samples of its one-node step
        reports over their seconds), not the allocator's estimate (the median of its latest
        reports, which follows the rate of the moment). On the emulation (``shared_cores``)
        a node is worth the share of a core its ranks get, which moves with how many emulated
        nodes share the cores at the time: P_j(1) is scaled to a node with a core of its own
        (each one-node report's seconds × its rank's CPU share), and the held node-seconds
        count at the share their step reports measured (the rest of the time, start-ups and
        stops, at the run's mean share: :meth:`node_capacity`, reported as
        ``node_capacity``, what the emulation itself cost), so that a task measured at one
        node while few nodes ran is not held to that rate while many do.

        A task never run at one node has no P(1): its samples and its node-seconds are both
        left out (``unmeasured_node_s``), rather than its node-seconds counted as work of
        none. util counts every node-second. A figure above 1 + :data:`E_SLACK` cannot be
        true, and ``suspect`` says so; one above 1 by less is that noise, and ``noise`` says
        to read it as 1."""
        off, used = self.offered_node_s, self.used_node_s
        cap = self.node_capacity()
        # Held node-seconds at what the nodes were worth: their step reports' spans at their
        # ranks' CPU share, the rest of the time (start-ups, stops) at the run's mean share.
        work = unmeasured = measured = capacity_s = 0.0
        for task in self.elastic.values():
            if task.one_node_s > 0 and task.one_node_samples > 0:
                work += task.samples / (task.one_node_samples / task.one_node_s)
                rest = max(0.0, task.node_s - task.report_node_s)
                capacity_s += task.report_capacity_s + rest * cap
                measured += task.node_s
            else:
                unmeasured += task.node_s
        measured_used = max(0.0, used - unmeasured)
        if self.shared_cores is None:
            capacity_s = measured_used  # a node is a node
        else:  # plain apps' node-seconds at the mean share
            capacity_s += max(0.0, measured_used - measured) * cap
        cap_used = min(capacity_s, measured_used)
        cap_off = cap_used + max(0.0, off - used) * cap  # the idle ones at the mean share
        out: dict[str, Any] = {
            "util": used / off if off else None,
            "E_used": work / cap_used if cap_used > 0 else None,
            "E_avail": work / cap_off if cap_off > 0 else None,
            "offered_node_s": off,
            "used_node_s": used,
            "unmeasured_node_s": unmeasured,
            "node_capacity": cap,
            "p1": (
                "each task's one-node rate in this run, scaled to a node with a core of its "
                f"own by its rank's CPU share ({self.shared_cores} cores shared by the "
                "emulated nodes)"
                if self.shared_cores is not None
                else "each task's one-node rate in this run"
            ),
        }
        above = [k for k in ("util", "E_used", "E_avail") if (out[k] or 0) > 1]
        over = [k for k in above if out[k] > 1 + E_SLACK]
        if over:
            out["suspect"] = f"{', '.join(over)} above 1: not a measurement of this run"
        if near := [k for k in above if k not in over]:
            out["noise"] = (
                f"{', '.join(near)} above 1 by at most {E_SLACK}: the noise of the one-node "
                "rate, to be read as 1"
            )
        return out

    # --- the decision -----------------------------------------------------------------------

    def _usable(self, now: float) -> dict[Node, float]:
        """Nodes of pilots not leaving → seconds left (inf when the pilot has no end)."""
        out = {}
        for view in self.pilots.values():
            if view.leaving:
                continue
            left = float("inf") if view.ends_at is None else view.ends_at - now
            for node in view.nodes:
                out[node] = left
        return out

    def _family_rates(self) -> dict[str, dict[int, list[float]]]:
        """Rates measured on each family's tasks (those running the same training code), per
        world size: what a task of the family with neither measurements nor a guess takes."""
        out: dict[str, dict[int, list[float]]] = {}
        for task in self.elastic.values():
            if task.family and task.measured:
                rates = out.setdefault(task.family, {})
                for n, measured in task.measured.items():
                    rates.setdefault(n, []).extend(measured)
        return out

    def status(self, now: float) -> dict[str, Any]:
        """``parsl-bf status``'s snapshot (:class:`~parsl_bf.executor.lifecycle.WriteStatus`)."""
        alloc = self.last_allocation
        return {
            "pilots": [
                {
                    "pilot": v.pilot,
                    "nodes": list(v.hosts),
                    "ends_in_s": None if v.ends_at is None else round(v.ends_at - now),
                    "leaving": v.leaving,
                }
                for v in self.pilots.values()
            ],
            "tasks": [
                {
                    "task": t.id,
                    "state": t.state,
                    "nodes": len(t.nodes),
                    "samples": t.samples,
                    "work": t.work,
                    "rate": _last_rate(t),
                    "metrics": t.metrics,
                }
                for t in self.elastic.values()
            ],
            "plain": {
                s: sum(1 for t in self.plain.values() if t.state == s)
                for s in ("queued", "running", "done")
            },
            "solves": self.solves,
            "last_solve_s": None if alloc is None else alloc.solve_s,
            "preemptions": self.preemptions,
            "accounting": self.efficiency(),
        }

    def outstanding_nodes(self) -> int:
        """Nodes the tasks could use now: what the scaling loop asks pilots for."""
        plain = sum(1 for t in self.plain.values() if t.state in ("queued", "running"))
        elastic = [t for t in self.elastic.values() if t.state in ("queued", "running", "stopping")]
        return plain + sum(t.max_nodes for t in elastic[: self.max_tasks])

    def _decide(self, now: float, out: list[Command]) -> None:
        """The allocation: plain tasks first, then the solver's counts for elastic tasks."""
        usable = self._usable(now)
        busy = {t.node for t in self.plain.values() if t.state == "running"}
        for task in self.elastic.values():
            busy.update(task.held())
        free = [n for n in usable if n not in busy]
        # Plain tasks first, on the shortest-lived free nodes (they are short).
        free.sort(key=lambda n: (usable[n], n))
        waiting_plain = 0
        for task in self.plain.values():
            if task.state != "queued":
                continue
            if not free:
                waiting_plain += 1
                continue
            node = free.pop(0)
            task.node, task.state = node, "running"
            task.attempts += 1
            out.append(RunPlain(task.id, *_split(node)))
        self._allocate_elastic(usable, free, waiting_plain, now, out)

    def _allocate_elastic(
        self,
        usable: dict[Node, float],
        free: list[Node],
        waiting_plain: int,
        now: float,
        out: list[Command],
    ) -> None:
        # A resolved task whose successor still runs (its predecessor finished the work during
        # a hand-over) trains no more: its nodes stay busy until that successor has ended.
        running = [t for t in self.elastic.values() if t.state == "running" and not t.resolved]
        queued = [t for t in self.elastic.values() if t.state == "queued"]
        stopping = sum(1 for t in self.elastic.values() if t.state == "stopping")
        admitted = queued[: max(0, self.max_tasks - len(running) - stopping)]
        candidates = running + admitted
        if not candidates:
            return
        # Long enough-lived free nodes only; none while plain tasks wait for one.
        offered = [n for n in free if usable[n] >= self.min_node_life_s]
        if waiting_plain:
            offered = []
        specs = []
        families = self._family_rates()  # once per decision, not once per task
        for task in candidates:
            nodes, rates = task.curve(families.get(task.family))
            cost = task.rescale_cost()
            down = task.shrink_cost() if self._shrinks_in_place(task) else cost
            up = task.grow_cost() if self.grow_in_place and task.resizes_in_place else cost
            # A task handing over, or resizing in place, keeps its size at this decision: plan
            # around it as it is.
            busy = task.previous or task.releasing or self._joining(task)
            lo, hi = (len(task.nodes),) * 2 if busy else (task.min_nodes, task.max_nodes)
            specs.append(
                TaskSpec(
                    id=task.id,
                    min_nodes=lo,
                    max_nodes=hi,
                    current_nodes=len(task.nodes),
                    nodes=nodes,
                    throughput=rates,
                    rescale_up_s=up,
                    rescale_down_s=down,
                    remaining_work=task.left(),
                )
            )
        problem = AllocationProblem(
            tasks=tuple(specs),
            free_nodes=len(offered),
            tfwd=self.effective_tfwd,
            objective=self.allocator.objective,
            # Capped at the remaining work, whether or not tasks wait (the replay caps only
            # while none waits): a fragment's rescale and a successor's start cost seconds, as
            # long as a short task's end, so a task near its end must not be grown. Never
            # capped, the local emulation's E_used fell from 0.87 to 0.39-0.41; uncapped while
            # tasks wait, 16 HPO trials averaged E_used 0.78 against 0.85 capped over 4 pairs of
            # runs (docs/policy-selection.md, "The remaining-work cap").
            cap_at_remaining_work=True,
            cap_while_waiting=True,
            tasks_waiting=len(admitted) < len(queued),
        )
        allocation = self.allocator(problem)
        self.last_allocation, self.solves = allocation, self.solves + 1
        out.append(Solved(allocation.solve_s))
        node_plan = plan(
            allocation.counts,
            {t.id: t.nodes for t in candidates},
            offered,
            node_value={n: min(usable[n], 1e12) for n in usable},
        )
        available = set(offered)
        # A node about to leave may stay with its task but is not worth moving: a task whose
        # new nodes include such a node held by another keeps what it has, and so does the
        # holder (stopping it would leave the node idle).
        holder = {n: t.id for t in candidates for n in t.nodes}
        frozen: set[str] = set()
        for task in candidates:
            moved = [
                n
                for n in node_plan.tasks[task.id].nodes
                if n not in task.nodes and n not in available and usable[n] < self.min_node_life_s
            ]
            if moved:
                frozen.add(task.id)
                frozen.update(holder[n] for n in moved if n in holder)
        for task in candidates:
            step = node_plan.tasks[task.id]
            # Same nodes in another order (plan sorts them by remaining life) is no rescale.
            same = set(step.nodes) == set(task.nodes)
            busy = task.previous is not None or task.releasing or self._joining(task)
            if same or task.id in frozen or busy:
                continue
            added = set(step.nodes) - set(task.nodes)
            running = task.state == "running"
            if running and not added and self._trains_on(task, len(step.nodes)):
                shrink = self._shrink(task, step.nodes, now)
                if shrink is not None:
                    out += [shrink, Note("fragment_shrink", _shrink_names(shrink))]
                    continue
            in_place = running and self._grows(task, len(added))
            if in_place and added <= available:
                grow = self._grow(task, step.nodes, now)
                if grow is not None:
                    names = {"task": task.id, "generation": task.generation}
                    out += [grow, Note("fragment_grow", names | {"nodes": len(task.nodes)})]
                    continue
            grows = added and set(task.nodes) <= set(step.nodes)
            if in_place and grows and not added <= available:
                # Onto nodes another task gives back now: they are busy until its ranks there
                # have left. Grow in place at the decision after, rather than stop and restart.
                continue
            if running and step.nodes and self.warm_rescale and added <= available:
                old = task.previous = (task.generation, task.nodes)
                out.append(self._start(task, step.nodes, after=old[0], now=now))
                self.handovers[(task.id, task.generation)] = _Handover(
                    old[0], step.action.value, now + self.handover_timeout_s
                )
            elif task.state == "running":  # a cold rescale or a stop: restart after it
                task.state = "stopping"
                self._stop(task.id, task.generation, step.action.value, now, out)
            elif step.nodes and not set(step.nodes) <= available:
                # Nodes another task gives back are busy until its fragment has stopped: start
                # at the decision that follows that stop.
                continue
            elif step.nodes:
                task.state = "running"
                out.append(self._start(task, step.nodes, after=None, now=now))


def renumbered(
    ranges: dict[int, tuple[int, int]], keep: tuple[int, ...]
) -> tuple[tuple[int, ...], int, dict[int, tuple[int, int]]]:
    """An in-place shrink to the launchers ``keep`` of a fragment whose launchers hold
    ``ranges`` (group → (first rank, ranks), as the ranks are numbered now): the ranks that
    stay, the world they are ranks of, and the ranges after it. The kept ranks keep their
    order and are numbered from 0 (``Comm.Split``)."""
    ranks = tuple(r for g in sorted(keep) for r in range(ranges[g][0], sum(ranges[g])))
    of = sum(count for _, count in ranges.values())
    after, first = {}, 0
    for g in sorted(keep):
        after[g] = (first, ranges[g][1])
        first += ranges[g][1]
    return ranks, of, after


def _last_rate(task: ElasticTask) -> float | None:
    rates = task.measured.get(len(task.nodes))
    return rates[-1] if rates else None


def _resizes(result: dict[str, Any] | None) -> bool:
    """Whether a fragment's result leaves its task able to resize in place: a loop of the
    task's own (:mod:`parsl_bf.training.elastic`) says ``"resizes_in_place": false``."""
    return result is None or result.get("resizes_in_place", True) is not False


def _names(fragment: Fragment) -> dict[str, Any]:
    return {"task": fragment.task, "generation": fragment.generation}


def _shrink_names(shrink: ShrinkFragment) -> dict[str, Any]:
    return {"task": shrink.task, "generation": shrink.generation, "keep": list(shrink.keep)}


def _placement(nodes: Iterable[Node]) -> Placement:
    """Group a fragment's nodes by pilot: one launcher (group) per pilot."""
    groups: dict[str, list[str]] = {}
    for node in nodes:
        pilot, host = _split(node)
        groups.setdefault(pilot, []).append(host)
    return tuple((pilot, tuple(hosts)) for pilot, hosts in groups.items())
