"""Counts → nodes without migration.

A task that shrinks releases some of its own nodes and takes none; a task that grows keeps all
of its own and takes free ones (or ones another task released in the same step); a task keeps
its nodes otherwise. So no node ever moves between two tasks in both directions at once (no
swaps), and a running fragment never has to move a rank it keeps.

When ``node_value`` is given (e.g. its pilot's remaining walltime), a shrinking task releases its
least valuable nodes and a growing task takes the most valuable free ones first; growers that
will hold the most nodes choose first, since a node's departure stops its whole task and a
larger task's restart costs more.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from .errors import PlanError

__all__ = ["Action", "TaskPlan", "NodePlan", "plan"]

Node = Hashable


class Action(StrEnum):
    START = "start"  # 0 → n
    STOP = "stop"  # n → 0
    GROW = "grow"
    SHRINK = "shrink"
    KEEP = "keep"
    IDLE = "idle"  # 0 → 0


@dataclass(frozen=True)
class TaskPlan:
    """What one task does at this step (its nodes lost to preemption are already gone)."""

    task_id: str
    keep: tuple[Node, ...]
    release: tuple[Node, ...] = ()
    add: tuple[Node, ...] = ()

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The task's nodes after the step."""
        return self.keep + self.add

    @property
    def action(self) -> Action:
        before, after = len(self.keep) + len(self.release), len(self.nodes)
        if before == after:
            return Action.KEEP if after else Action.IDLE
        if before == 0:
            return Action.START
        if after == 0:
            return Action.STOP
        return Action.GROW if after > before else Action.SHRINK


@dataclass(frozen=True)
class NodePlan:
    """Per-task node changes for one step, plus the nodes left idle and those lost."""

    tasks: dict[str, TaskPlan]
    idle: tuple[Node, ...]
    lost: tuple[Node, ...] = field(default=())

    def _with(self, action: Action) -> list[str]:
        return [tid for tid, tp in self.tasks.items() if tp.action is action]

    @property
    def starts(self) -> list[str]:
        return self._with(Action.START)

    @property
    def stops(self) -> list[str]:
        return self._with(Action.STOP)

    @property
    def grows(self) -> list[str]:
        return self._with(Action.GROW)

    @property
    def shrinks(self) -> list[str]:
        return self._with(Action.SHRINK)

    def assignment(self) -> dict[str, tuple[Node, ...]]:
        return {tid: tp.nodes for tid, tp in self.tasks.items()}


def plan(
    counts: Mapping[str, int],
    current: Mapping[str, Collection[Node]],
    free: Collection[Node],
    *,
    preempted: Collection[Node] = (),
    node_value: Mapping[Node, float] | None = None,
) -> NodePlan:
    """Map target ``counts`` onto nodes, given each task's ``current`` nodes and the ``free`` ones.

    ``preempted`` nodes are dropped from every set before planning and never assigned.
    Raises :class:`PlanError` if a node is held twice or the counts need more nodes than exist.
    """
    gone = set(preempted)
    owner: dict[Node, str] = {}
    for tid, nodes in current.items():
        for node in nodes:
            if node in owner:
                raise PlanError(f"node {node!r} is held by both {owner[node]!r} and {tid!r}")
            owner[node] = tid
    for node in free:
        if node in owner:
            raise PlanError(f"node {node!r} is listed free but held by {owner[node]!r}")
    for tid, n in counts.items():
        if n < 0:
            raise PlanError(f"counts[{tid}]: negative count {n}")

    def value(node: Node) -> float:
        return 0.0 if node_value is None else node_value.get(node, 0.0)

    def by_value(nodes: list[Node]) -> list[Node]:
        # Stable sort: equal values keep their given order.
        return sorted(nodes, key=value, reverse=True) if node_value is not None else nodes

    order = dict.fromkeys([*counts, *current])  # deterministic, unlike a set
    held = {tid: by_value([x for x in current.get(tid, ()) if x not in gone]) for tid in order}
    steps: dict[str, TaskPlan] = {}
    released: list[Node] = []
    for tid, nodes in held.items():
        want = counts.get(tid, 0)
        if want < len(nodes):
            steps[tid] = TaskPlan(tid, tuple(nodes[:want]), tuple(nodes[want:]))
            released.extend(nodes[want:])
        else:
            steps[tid] = TaskPlan(tid, tuple(nodes))
    pool = by_value([x for x in free if x not in gone]) + by_value(released)
    need = sum(max(0, counts.get(tid, 0) - len(nodes)) for tid, nodes in held.items())
    if need > len(pool):
        raise PlanError(f"counts need {need} more nodes, only {len(pool)} are free or released")
    taken = 0
    growers = list(counts)  # in the caller's order; with values, the largest first (stable)
    if node_value is not None:
        growers.sort(key=lambda tid: -counts[tid])
    for tid in growers:
        extra = counts[tid] - len(held[tid])
        if extra > 0:
            steps[tid] = TaskPlan(tid, steps[tid].keep, (), tuple(pool[taken : taken + extra]))
            taken += extra
    lost = tuple(x for x in owner if x in gone) + tuple(x for x in free if x in gone)
    return NodePlan({tid: steps[tid] for tid in order}, tuple(pool[taken:]), lost)
