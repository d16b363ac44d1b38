"""What the controller knows: live pilots, elastic and plain tasks, running fragments, as
plain data (no I/O, no decisions beyond each object's own arithmetic)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from ..allocation import Allocation, AllocatorSettings
from .lifecycle import Placement

if TYPE_CHECKING:
    from .lifecycle import Command, GrowFragment, ShrinkFragment, StartFragment

__all__ = [
    "Node",
    "TaskState",
    "node_id",
    "split_node",
    "PilotView",
    "ElasticTask",
    "PlainTask",
    "Fragment",
    "Handover",
    "ControllerState",
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


class TaskState(StrEnum):
    """Where a task is. An elastic task: ``queued`` (no fragment: waiting for nodes, or
    between two fragments), ``running`` (a fragment holds its nodes), ``stopping`` (told to
    stop, for a cold rescale or a preemption: it starts again once its fragments have all
    exited), then ``done`` or ``failed``. A plain task: ``queued``, ``running``, ``done``."""

    QUEUED = "queued"
    RUNNING = "running"
    STOPPING = "stopping"
    DONE = "done"
    FAILED = "failed"


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
    state: TaskState = TaskState.QUEUED
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
        rates: list[float] = []
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
        nodes = set(self.nodes) if self.state in (TaskState.RUNNING, TaskState.STOPPING) else set()
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
    state: TaskState = TaskState.QUEUED  # QUEUED, RUNNING, DONE
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
class Handover:
    """A warm successor's predecessor, to stop once the successor is ready (or at deadline)."""

    previous: int  # the generation to stop
    reason: str
    deadline: float


def split_node(node: Node) -> tuple[str, str]:
    pilot, _, host = node.rpartition("/")
    return pilot, host


class ControllerState:
    """What the controller knows, declared once for all its roles
    (:class:`~parsl_bf.executor.fragments.FragmentLifecycle`,
    :class:`~parsl_bf.executor.allocating.Allocating`,
    :class:`~parsl_bf.executor.accounting.Accounting`); set by
    :class:`~parsl_bf.executor.controller.Controller`'s constructor, whose docstring explains
    the settings."""

    # Settings.
    allocator: AllocatorSettings
    shrink_in_place: bool  # the allocator's, read once (the allocator may be wrapped later)
    grow_in_place: bool
    max_tasks: int
    min_node_life_s: float
    warm_rescale: bool
    walltime_notice_s: float
    handover_timeout_s: float
    stop_grace_s: float
    start_timeout_s: float
    max_restarts: int
    shared_cores: int | None
    # What is live.
    pilots: dict[str, PilotView]
    elastic: dict[str, ElasticTask]
    plain: dict[str, PlainTask]
    fragments: dict[tuple[str, int], Fragment]  # (task, generation) → running
    handovers: dict[tuple[str, int], Handover]  # (task, successor generation) → hand-over
    # What it learnt and decided.
    hole_lengths: list[float]  # the pilots' walltimes when they came: T_fwd ``auto``
    last_allocation: Allocation | None
    solves: int
    preemptions: int
    # The run's accounting (docs/replay.md's metrics, measured): node-seconds offered by
    # pilots not leaving and used by tasks, and when they were last brought up to date.
    offered_node_s: float
    used_node_s: float
    _accounted_at: float | None

    if TYPE_CHECKING:  # what each role calls on another (defined there, once)

        @property
        def effective_tfwd(self) -> float: ...
        def _leaving(self, pilot: str) -> bool: ...
        def _shrinks_in_place(self, task: ElasticTask) -> bool: ...
        def _joining(self, task: ElasticTask) -> bool: ...
        def _start(
            self, task: ElasticTask, nodes: Sequence[Node], after: int | None, now: float
        ) -> StartFragment: ...
        def _shrink(
            self, task: ElasticTask, nodes: Sequence[Node], now: float
        ) -> ShrinkFragment | None: ...
        def _grow(
            self, task: ElasticTask, nodes: Sequence[Node], now: float
        ) -> GrowFragment | None: ...
        def _stop(
            self, task_id: str, generation: int, reason: str, now: float, out: list[Command]
        ) -> None: ...
