"""The fragment lifecycle, the controller's role that starts, resizes, stops and
classifies the end of each fragment (:class:`FragmentLifecycle`).

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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .lifecycle import (
    Command,
    Fail,
    FragmentOver,
    GrowFragment,
    LogEvent,
    MarkLost,
    Note,
    Placement,
    RankGroup,
    Resolve,
    ShrinkFragment,
    Signal,
    StartFragment,
    fragment_key,
    launch_failed,
)
from .state import (
    START_MARGIN,
    STOPS_KEPT,
    ControllerState,
    ElasticTask,
    Fragment,
    Node,
    TaskState,
    node_id,
    split_node,
)

__all__ = ["FragmentLifecycle", "renumbered"]


class FragmentLifecycle(ControllerState):
    """The controller's fragments: their start, in-place shrink and grow, stop, and the
    classification of their end (module docstring). A role of
    :class:`~parsl_bf.executor.controller.Controller`, on its state
    (:class:`~parsl_bf.executor.state.ControllerState`)."""

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
        out.append(Note(LogEvent.FRAGMENT_START_TIMEOUT, note_fields(fragment) | {"where": where}))
        self._stop(task.id, fragment.generation, "start timed out", now, out)

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

    def _shrink(
        self, task: ElasticTask, nodes: Sequence[Node], now: float
    ) -> ShrinkFragment | None:
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
            out.append(
                Note(LogEvent.FRAGMENT_GROWN, note_fields(fragment) | {"nodes": len(task.nodes)})
            )

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
        out.append(Note(LogEvent.FRAGMENT_STOP, note_fields(fragment) | {"reason": reason}))

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
                task.releasing = tuple(n for n in task.releasing if split_node(n)[0] != pilot)
                if not fragment.leaving:
                    fragment.shrink_deadline = None
                    out.append(
                        Note(
                            LogEvent.FRAGMENT_SHRUNK,
                            note_fields(fragment) | {"nodes": len(task.nodes)},
                        )
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
        names = note_fields(fragment)
        if task.resumed_samples is None and result and "loaded_samples" in result:
            # It ended before its first step (the checkpoint it found was the last).
            task.resumed_samples = int(result["loaded_samples"])
        if fragment.generation != task.generation:  # superseded by a warm successor
            if result is None:
                # It died: the successor, waiting for its result, takes over from the last
                # checkpoint as after a preemption.
                out += [
                    Note(LogEvent.FRAGMENT_LOST, names | {"code": fragment.code}),
                    MarkLost(task.id, fragment.generation),
                ]
            elif status == "done":
                # It finished the work before its successor took over: that is the task's
                # result (the successor finds the final checkpoint and ends at once).
                self._resolve(task, result, out)
            else:
                out.append(Note(LogEvent.FRAGMENT_STOPPED, names | {"samples": samples}))
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
                out.append(Note(LogEvent.TASK_RESIZES_BY_RESTART, names))
            if status == "stopped" and fragment.stopped_at is not None and not fragment.lost:
                task.stops_s.append(now - fragment.stopped_at)
                del task.stops_s[:-STOPS_KEPT]
            out.append(Note(LogEvent.FRAGMENT_STOPPED, names | {"samples": samples}))
            self._ended(task, fragment.generation, "stopped", samples, now, out)
        elif task.restarts < self.max_restarts:
            # A crash (a rank killed, out of memory, a node lost, a launch that failed): again
            # from the checkpoint.
            task.restarts += 1
            task.redo_from = max(task.redo_from or 0, task.samples)
            failed = names | {"code": fragment.code, "restarts": task.restarts}
            if fragment.why_failed:
                failed["why"] = fragment.why_failed
            out.append(Note(LogEvent.FRAGMENT_FAILED, failed))
            self._ended(task, fragment.generation, "stopped", samples, now, out)
        else:
            why = fragment.why_failed or f"exit {fragment.code}"
            why = f"{why} after {task.restarts} restarts"
            self._fail(task, why, fragment.generation, out)
            self._ended(task, fragment.generation, "failed", samples, now, out)

    def _fail(
        self, task: ElasticTask, error: str, generation: int | None, out: list[Command]
    ) -> None:
        out.append(Note(LogEvent.TASK_FAILED, {"task": task.id, "error": error.splitlines()[-1:]}))
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
                Note(LogEvent.TASK_DONE, {"task": task.id, "samples": result.get("samples")}),
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
            if task.state == TaskState.STOPPING and not task.nodes:
                task.state = TaskState.QUEUED
            if task.state == TaskState.QUEUED and task.resolved:
                # It finished the work after its successor had already ended: nothing is left.
                task.state = TaskState.DONE
            return
        if generation != task.generation:
            return
        task.nodes, task.releasing = (), ()
        task.state = {"done": TaskState.DONE, "failed": TaskState.FAILED}.get(
            status, TaskState.QUEUED
        )
        if task.state == TaskState.QUEUED and task.resolved:
            # A predecessor finished the work during a hand-over: nothing is left to train.
            # Reports that reached the work are not enough (see ElasticTask.left).
            task.state = TaskState.DONE
        if task.previous is not None:
            # The successor ended before the hand-over: the previous fragment must stop
            # before the task may start again (two fragments would share one checkpoint).
            self.handovers.pop((task.id, generation), None)
            self._stop(task.id, task.previous[0], "successor ended", now, out)
            if task.state == TaskState.QUEUED:
                task.state = TaskState.STOPPING


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


def _resizes(result: dict[str, Any] | None) -> bool:
    """Whether a fragment's result leaves its task able to resize in place: a loop of the
    task's own (:mod:`parsl_bf.training.elastic`) says ``"resizes_in_place": false``."""
    return result is None or result.get("resizes_in_place", True) is not False


def note_fields(fragment: Fragment) -> dict[str, Any]:
    return {"task": fragment.task, "generation": fragment.generation}


def shrink_fields(shrink: ShrinkFragment) -> dict[str, Any]:
    return {"task": shrink.task, "generation": shrink.generation, "keep": list(shrink.keep)}


def _placement(nodes: Iterable[Node]) -> Placement:
    """Group a fragment's nodes by pilot: one launcher (group) per pilot."""
    groups: dict[str, list[str]] = {}
    for node in nodes:
        pilot, host = split_node(node)
        groups.setdefault(pilot, []).append(host)
    return tuple((pilot, tuple(hosts)) for pilot, hosts in groups.items())
