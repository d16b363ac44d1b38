"""The executor's decisions, without I/O: which fragment runs where, after every event.

The :class:`Controller` holds what the executor knows (live pilots and their nodes, elastic
training tasks and plain tasks) and turns each event into :class:`Action`s for the executor to
carry out. On every event that may change the best allocation it re-solves with the allocator
(same code and objectives as the replay simulator), maps the counts to nodes without migration
(:func:`parsl_bf.allocation.plan`), and rescales a fragment by handing it over to a new one.

A rescale is warm when every node the new size adds is free: the new fragment starts at once
on its nodes (sharing the kept ones with the old ranks for a moment), imports and builds its
model while the old one keeps training, and the old one is stopped only when the new one is
ready (``StopFragment.when_ready``); the new ranks then wait for the old result and take over
from its checkpoint. Otherwise (nodes still held by another task, or ``warm_rescale=False``)
it is cold: stop, and start the new size at the decision after the stop.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..allocation import Allocation, AllocationProblem, Objective, TaskSpec, allocate, plan

__all__ = [
    "Controller",
    "ElasticTask",
    "PlainTask",
    "PilotView",
    "StartFragment",
    "StopFragment",
    "RunPlain",
    "Action",
    "node_id",
]

# A node is named "<pilot>/<host>": the same host may come back in another pilot.
Node = str

# Step rates kept per task and world size (the latest): recent enough, and bounded memory.
MEASURED_KEPT = 100


def node_id(pilot: str, host: str) -> Node:
    return f"{pilot}/{host}"


@dataclass
class PilotView:
    """A live pilot: its nodes, when it ends, whether it is leaving (preempted, ending)."""

    pilot: str
    hosts: tuple[str, ...]
    ends_at: float | None
    leaving: bool = False

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
    scaling: dict[int, float] = field(default_factory=dict)  # the user's guess, samples/s
    rescale_s: float = 10.0  # the user's guess of a rescale's cost
    samples: int = 0
    nodes: tuple[Node, ...] = ()  # the running fragment's nodes
    generation: int = 0  # fragments started so far
    state: str = "queued"  # queued, running, stopping, done, failed
    # The previous fragment (generation, nodes) while it hands over to the current one: its
    # nodes stay busy, and the task is not rescaled again, until it has exited.
    previous: tuple[int, tuple[Node, ...]] | None = None
    measured: dict[int, list[float]] = field(default_factory=dict)  # world → samples/s
    measured_rescale_s: list[float] = field(default_factory=list)

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

    def held(self) -> set[Node]:
        """The nodes its fragments occupy: the current one's and a handing-over one's."""
        nodes = set(self.nodes) if self.state in ("running", "stopping") else set()
        return nodes | set(self.previous[1]) if self.previous is not None else nodes

    def rescale_cost(self) -> float:
        return (
            statistics.median(self.measured_rescale_s)
            if self.measured_rescale_s
            else self.rescale_s
        )


@dataclass
class PlainTask:
    """An ordinary Parsl app: one process on one node."""

    id: str
    node: Node | None = None
    state: str = "queued"  # queued, running, done
    attempts: int = 0


@dataclass(frozen=True)
class StartFragment:
    """Start ``task``'s fragment number ``generation`` on these hosts of these pilots; with
    ``after``, as a warm successor of that generation (it takes over from its checkpoint)."""

    task: str
    generation: int
    placement: tuple[tuple[str, tuple[str, ...]], ...]  # (pilot, hosts) per group
    after: int | None = None


@dataclass(frozen=True)
class StopFragment:
    """Ask the fragment's ranks to checkpoint and exit (a rescale, a stop, a preemption); with
    ``when_ready``, only once that generation of the task is set up (a warm rescale)."""

    task: str
    generation: int
    reason: str
    when_ready: int | None = None


@dataclass(frozen=True)
class RunPlain:
    task: str
    pilot: str
    host: str


Action = StartFragment | StopFragment | RunPlain


def _split(node: Node) -> tuple[str, str]:
    pilot, _, host = node.rpartition("/")
    return pilot, host


class Controller:
    """Decisions of the BackfillExecutor; see the module docstring.

    Parameters
    ----------
    objective, tfwd, time_limit
        The allocator's objective, look-ahead (seconds; None: the median walltime of the
        pilots seen so far, i.e. of the holes, 60 s until one is known) and solver time limit.
    max_tasks
        Elastic tasks running at once (first come first served).
    min_node_life_s
        Nodes whose pilot ends sooner are not offered to elastic tasks (0: the paper's model).
    warm_rescale
        Hand a rescaled fragment over to its successor warm when the nodes allow (module
        docstring); False: always stop first, then start.
    """

    def __init__(
        self,
        objective: Objective | str = Objective.THROUGHPUT,
        tfwd: float | None = 60.0,
        time_limit: float = 10.0,
        max_tasks: int = 10,
        min_node_life_s: float = 0.0,
        warm_rescale: bool = True,
    ) -> None:
        self.objective = Objective(objective)
        self.tfwd, self.time_limit = tfwd, time_limit
        self.max_tasks, self.min_node_life_s = max_tasks, min_node_life_s
        self.warm_rescale = warm_rescale
        self.pilots: dict[str, PilotView] = {}
        self.elastic: dict[str, ElasticTask] = {}
        self.plain: dict[str, PlainTask] = {}
        self.last_allocation: Allocation | None = None
        self.solves = 0
        self.hole_lengths: list[float] = []
        # The run's accounting (DESIGN.md's replay metrics, measured): node-seconds offered by
        # pilots not leaving, node-seconds running tasks, and when it was last brought up to date.
        self.offered_node_s = self.used_node_s = 0.0
        self._accounted_at: float | None = None

    @property
    def effective_tfwd(self) -> float:
        if self.tfwd is not None:
            return self.tfwd
        return statistics.median(self.hole_lengths) if self.hole_lengths else 60.0

    # --- events -----------------------------------------------------------------------------

    def pilot_up(self, pilot: str, hosts: Iterable[str], ends_at: float | None, now: float):
        self.pilots[pilot] = PilotView(pilot, tuple(hosts), ends_at)
        if ends_at is not None:
            self.hole_lengths.append(max(1.0, ends_at - now))
        return self.decide(now)

    def pilot_leaving(self, pilot: str, now: float, reason: str = "preempted") -> list[Action]:
        """The pilot was told to go (preemption, walltime end): its fragments checkpoint now."""
        view = self.pilots.get(pilot)
        if view is None or view.leaving:
            return []
        view.leaving = True
        actions: list[Action] = []
        for task in self.elastic.values():
            hit = task.state == "running" and any(_split(n)[0] == pilot for n in task.nodes)
            if hit:
                task.state = "stopping"
                actions.append(StopFragment(task.id, task.generation, reason))
            if task.previous is not None and (
                hit or any(_split(n)[0] == pilot for n in task.previous[1])
            ):
                # Its successor is stopping or its own nodes go: no hand-over, stop it now.
                actions.append(StopFragment(task.id, task.previous[0], reason))
        return actions + self.decide(now)

    def pilot_gone(self, pilot: str, now: float) -> list[Action]:
        """The pilot ended or stopped answering. Plain tasks on it are queued again (a
        preemption is not their failure); fragments on it were stopped (or are stopped now)."""
        actions = self.pilot_leaving(pilot, now, "pilot gone")
        self.pilots.pop(pilot, None)
        for task in self.plain.values():
            if task.state == "running" and task.node and _split(task.node)[0] == pilot:
                task.state, task.node = "queued", None
        return actions + self.decide(now)

    def submit_elastic(self, task: ElasticTask, now: float) -> list[Action]:
        self.elastic[task.id] = task
        return self.decide(now)

    def submit_plain(self, task: PlainTask, now: float) -> list[Action]:
        self.plain[task.id] = task
        return self.decide(now)

    def plain_finished(self, task_id: str, now: float, lost: bool = False) -> list[Action]:
        """A plain task's process ended; ``lost``: killed with its pilot, run it again."""
        task = self.plain[task_id]
        task.node = None
        task.state = "queued" if lost else "done"
        return self.decide(now)

    def fragment_ended(
        self, task_id: str, generation: int, status: str, samples: int, now: float
    ) -> list[Action]:
        """All ranks of a fragment exited: ``done`` (all the work), ``stopped`` (checkpointed;
        it continues at the next decision) or ``failed``."""
        task = self.elastic[task_id]
        task.samples = max(task.samples, samples)
        if task.previous is not None and generation == task.previous[0]:
            task.previous = None  # handed over (or stopped): its nodes are free
            if task.state == "stopping" and not task.nodes:
                task.state = "queued"
            return self.decide(now)
        if generation != task.generation:
            return []
        task.nodes = ()
        task.state = {"done": "done", "failed": "failed"}.get(status, "queued")
        if task.state == "queued" and task.samples >= task.work:
            # A predecessor finished the work during a hand-over: nothing is left to train.
            task.state = "done"
        actions: list[Action] = []
        if task.previous is not None:
            # The successor ended before the hand-over: the previous fragment must stop
            # before the task may start again (two fragments would share one checkpoint).
            actions.append(StopFragment(task.id, task.previous[0], "successor ended"))
            if task.state == "queued":
                task.state = "stopping"
        return actions + self.decide(now)

    def progress(self, task_id: str, world: int, rate: float, samples: int) -> None:
        """A fragment's step report: learn its scaling curve."""
        task = self.elastic.get(task_id)
        if task is not None and rate > 0:
            rates = task.measured.setdefault(world, [])
            rates.append(rate)
            del rates[:-MEASURED_KEPT]
            task.samples = max(task.samples, samples)

    def rescaled(self, task_id: str, seconds: float) -> None:
        """A fragment took ``seconds`` from its predecessor's stop to its first step."""
        task = self.elastic.get(task_id)
        if task is not None and seconds >= 0:
            task.measured_rescale_s.append(seconds)

    # --- accounting -------------------------------------------------------------------------

    def account(self, now: float) -> None:
        """Add the node-seconds since the last call (call at every event and tick)."""
        if self._accounted_at is not None and now > self._accounted_at:
            dt = now - self._accounted_at
            offered = sum(len(v.hosts) for v in self.pilots.values() if not v.leaving)
            used = sum(1 for t in self.plain.values() if t.state == "running") + sum(
                len(t.held()) for t in self.elastic.values()
            )
            self.offered_node_s += dt * offered
            self.used_node_s += dt * min(used, offered) if offered else 0.0
        self._accounted_at = now

    def efficiency(self) -> dict[str, float | None]:
        """util, E_used and E_avail of the run so far (samples_j / P_j(1) as in the replay,
        with P_j(1) measured; tasks never measured at one node are left out)."""
        work = 0.0
        for task in self.elastic.values():
            rates = task.measured.get(1)
            if rates and task.samples:
                work += task.samples / statistics.median(rates)
        off, used = self.offered_node_s, self.used_node_s
        return {
            "util": used / off if off else None,
            "E_used": work / used if used else None,
            "E_avail": work / off if off else None,
            "offered_node_s": off,
            "used_node_s": used,
        }

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

    def _siblings(self, task: ElasticTask) -> dict[int, list[float]]:
        """Rates measured on the other tasks of ``task``'s family, per world size."""
        out: dict[int, list[float]] = {}
        if not task.family:
            return out
        for other in self.elastic.values():
            if other is not task and other.family == task.family:
                for n, rates in other.measured.items():
                    out.setdefault(n, []).extend(rates)
        return out

    def outstanding_nodes(self) -> int:
        """Nodes the tasks could use now: what the scaling loop asks pilots for."""
        plain = sum(1 for t in self.plain.values() if t.state in ("queued", "running"))
        elastic = [t for t in self.elastic.values() if t.state in ("queued", "running", "stopping")]
        return plain + sum(t.max_nodes for t in elastic[: self.max_tasks])

    def decide(self, now: float) -> list[Action]:
        usable = self._usable(now)
        busy = {t.node for t in self.plain.values() if t.state == "running"}
        for task in self.elastic.values():
            busy.update(task.held())
        free = [n for n in usable if n not in busy]
        actions: list[Action] = []
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
            actions.append(RunPlain(task.id, *_split(node)))
        actions += self._allocate_elastic(usable, free, waiting_plain, now)
        return actions

    def _allocate_elastic(
        self, usable: dict[Node, float], free: list[Node], waiting_plain: int, now: float
    ) -> list[Action]:
        running = [t for t in self.elastic.values() if t.state == "running"]
        queued = [t for t in self.elastic.values() if t.state == "queued"]
        stopping = sum(1 for t in self.elastic.values() if t.state == "stopping")
        candidates = running + queued[: max(0, self.max_tasks - len(running) - stopping)]
        if not candidates:
            return []
        # Long enough-lived free nodes only; none while plain tasks wait for one.
        offered = [n for n in free if usable[n] >= self.min_node_life_s]
        if waiting_plain:
            offered = []
        specs = []
        for task in candidates:
            nodes, rates = task.curve(self._siblings(task))
            cost = task.rescale_cost()
            # A task handing over keeps its size at this decision: plan around it as it is.
            lo, hi = (len(task.nodes),) * 2 if task.previous else (task.min_nodes, task.max_nodes)
            specs.append(
                TaskSpec(
                    id=task.id,
                    min_nodes=lo,
                    max_nodes=hi,
                    current_nodes=len(task.nodes),
                    nodes=nodes,
                    throughput=rates,
                    rescale_up_s=cost,
                    rescale_down_s=cost,
                    remaining_work=max(0.0, float(task.work - task.samples)),
                )
            )
        problem = AllocationProblem(
            tasks=tuple(specs),
            free_nodes=len(offered),
            tfwd=self.effective_tfwd,
            objective=self.objective,
            cap_at_remaining_work=True,
        )
        allocation = allocate(problem, "milp", self.time_limit)
        self.last_allocation, self.solves = allocation, self.solves + 1
        node_plan = plan(
            allocation.counts,
            {t.id: t.nodes for t in candidates},
            offered,
            node_value={n: min(usable[n], 1e12) for n in usable},
        )
        actions: list[Action] = []
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
            if step.nodes == task.nodes or task.id in frozen or task.previous is not None:
                continue
            added = set(step.nodes) - set(task.nodes)
            if task.state == "running" and step.nodes and self.warm_rescale and added <= available:
                old = task.generation
                task.previous = (old, task.nodes)
                task.nodes, task.generation = tuple(step.nodes), old + 1
                actions.append(
                    StartFragment(task.id, task.generation, _placement(step.nodes), after=old)
                )
                actions.append(
                    StopFragment(task.id, old, step.action.value, when_ready=task.generation)
                )
            elif task.state == "running":  # a cold rescale or a stop: restart after it
                task.state = "stopping"
                actions.append(StopFragment(task.id, task.generation, step.action.value))
            elif step.nodes and not set(step.nodes) <= available:
                # Nodes another task gives back are busy until its fragment has stopped: start
                # at the decision that follows that stop.
                continue
            elif step.nodes:
                task.nodes, task.state = tuple(step.nodes), "running"
                task.generation += 1
                actions.append(StartFragment(task.id, task.generation, _placement(step.nodes)))
        return actions


def _placement(nodes: Iterable[Node]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Group a fragment's nodes by pilot: one launcher (group) per pilot."""
    groups: dict[str, list[str]] = {}
    for node in nodes:
        pilot, host = _split(node)
        groups.setdefault(pilot, []).append(host)
    return tuple((pilot, tuple(hosts)) for pilot, hosts in groups.items())
