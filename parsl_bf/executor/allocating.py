"""The allocation, the controller's role that turns the solver's counts into fragments
(:class:`Allocating`): plain tasks first, one node each; then one solve for the elastic
tasks (:class:`~parsl_bf.allocation.AllocatorSettings`, the replay's policy object), whose
counts are mapped to nodes without migration (:func:`parsl_bf.allocation.plan`) and carried
out as starts, warm or cold rescales, in-place shrinks and grows, and stops. Which resizes are
done in place is :mod:`parsl_bf.decisions`' rule, the one the ranks and the replay follow."""

from __future__ import annotations

from ..allocation import AllocationProblem, TaskSpec, plan
from ..decisions import grows_in_place, trains_on_in_place
from .fragments import shrink_fields
from .lifecycle import Command, LogEvent, Note, RunPlain, Solved
from .state import ControllerState, ElasticTask, Handover, Node, TaskState, split_node

__all__ = ["Allocating"]


class Allocating(ControllerState):
    """One allocation decision per batch. A role of
    :class:`~parsl_bf.executor.controller.Controller`, on its state
    (:class:`~parsl_bf.executor.state.ControllerState`)."""

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

    def outstanding_nodes(self) -> int:
        """Nodes the tasks could use now: what the scaling loop asks pilots for."""
        plain = sum(
            1 for t in self.plain.values() if t.state in (TaskState.QUEUED, TaskState.RUNNING)
        )
        elastic = [
            t
            for t in self.elastic.values()
            if t.state in (TaskState.QUEUED, TaskState.RUNNING, TaskState.STOPPING)
        ]
        return plain + sum(t.max_nodes for t in elastic[: self.max_tasks])

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

    def _decide(self, now: float, out: list[Command]) -> None:
        """The allocation: plain tasks first, then the solver's counts for elastic tasks."""
        usable = self._usable(now)
        busy = {t.node for t in self.plain.values() if t.state == TaskState.RUNNING}
        for task in self.elastic.values():
            busy.update(task.held())
        free = [n for n in usable if n not in busy]
        # Plain tasks first, on the shortest-lived free nodes (they are short).
        free.sort(key=lambda n: (usable[n], n))
        waiting_plain = 0
        for plain in self.plain.values():
            if plain.state != TaskState.QUEUED:
                continue
            if not free:
                waiting_plain += 1
                continue
            node = free.pop(0)
            plain.node, plain.state = node, TaskState.RUNNING
            plain.attempts += 1
            out.append(RunPlain(plain.id, *split_node(node)))
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
        running = [
            t for t in self.elastic.values() if t.state == TaskState.RUNNING and not t.resolved
        ]
        queued = [t for t in self.elastic.values() if t.state == TaskState.QUEUED]
        stopping = sum(1 for t in self.elastic.values() if t.state == TaskState.STOPPING)
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
            running = task.state == TaskState.RUNNING
            if running and not added and self._trains_on(task, len(step.nodes)):
                shrink = self._shrink(task, step.nodes, now)
                if shrink is not None:
                    out += [shrink, Note(LogEvent.FRAGMENT_SHRINK, shrink_fields(shrink))]
                    continue
            in_place = running and self._grows(task, len(added))
            if in_place and added <= available:
                grow = self._grow(task, step.nodes, now)
                if grow is not None:
                    names = {"task": task.id, "generation": task.generation}
                    out += [grow, Note(LogEvent.FRAGMENT_GROW, names | {"nodes": len(task.nodes)})]
                    continue
            grows = added and set(task.nodes) <= set(step.nodes)
            if in_place and grows and not added <= available:
                # Onto nodes another task gives back now: they are busy until its ranks there
                # have left. Grow in place at the decision after, rather than stop and restart.
                continue
            if running and step.nodes and self.warm_rescale and added <= available:
                old = task.previous = (task.generation, task.nodes)
                out.append(self._start(task, step.nodes, after=old[0], now=now))
                self.handovers[(task.id, task.generation)] = Handover(
                    old[0], step.action.value, now + self.handover_timeout_s
                )
            elif task.state == TaskState.RUNNING:  # a cold rescale or a stop: restart after it
                task.state = TaskState.STOPPING
                self._stop(task.id, task.generation, step.action.value, now, out)
            elif step.nodes and not set(step.nodes) <= available:
                # Nodes another task gives back are busy until its fragment has stopped: start
                # at the decision that follows that stop.
                continue
            elif step.nodes:
                task.state = TaskState.RUNNING
                out.append(self._start(task, step.nodes, after=None, now=now))
