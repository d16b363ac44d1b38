"""Event-driven replay of an idle-node trace, with the original replayer's accounting.

At every trace time some nodes change state. Between two events a task progresses
Δt·P(n) samples, minus the rescale charge R_up·P(c) or R_down·P(c) of the event at which its
count changed from c to n (with ``charge_starts``, a start from c = 0 is charged R_up·P(n), or
the job's own start cost ``Job.start_s``·P(n) where it has one). A planned rescale that the
executor does in place costs S_r·P(c) instead (``rescale_in_place_s`` = S_r): a running task's
shrink that keeps nodes, and its grow; a grow onto nodes another task gives back at the same
event waits for them at its old rate (S_r for a shrink in place, the giver's R_down for a
stop), as the executor's grow waits for their ranks to leave. A task that loses nodes to
preemption is charged once per event: S·P(c) when at least its ``min_nodes`` stay, which train
on in place while the preempted ranks leave, as in the executor (``preemption_shrink_s`` = S);
else R_down·P(c), and it restarts once there: a rescale at that event is part of it
(``restart_once``). Tasks are admitted first come first served, at most ``max_jobs`` at a time,
and end the second their samples reach their work. As in the executor, that second is an event
of its own, and so is a job's submission while a slot is free (``task_events``; False: both
wait for the trace's next event, as in the original). The allocation itself is the policy's
(the same code the executor runs); nodes are mapped with :func:`~parsl_bf.allocation.plan`,
so a node is never moved between tasks that keep running.

Every replay also reports ``E_avail_bound``, the clairvoyant upper bound of
:mod:`parsl_bf.replay.bound` on the same instance (the window, the jobs), and
``E_avail_over_bound``; an E_avail above its bound is flagged as a bug (``bound_violation``).
The bound gives rescales and preemptions away; ``E_avail_rescale_charges`` and
``E_avail_preemption_charges`` are what their charges cost this replay, in E_avail's units
(samples / P_j(1) per idle node-second), so the gap to the bound splits into those charges
and the rest (the allocation itself; without task events, also a job's nodes training past its
end until the next event).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..allocation import DEFAULT_SETTINGS, AllocationProblem, Objective, TaskSpec, plan
from ..decisions import grows_in_place, resolve_tfwd, trains_on_in_place
from ..inputs.trace import IdleTrace
from .bound import DEFAULT_BUCKETS, e_avail_bound, idle_profile, violation
from .holes import HoleForecast, planned_ends
from .jobsets import Job
from .policies import Policy

__all__ = ["ORIGINAL_ACCOUNTING", "ReplayConfig", "ReplayResult", "StepRow", "replay"]

FREE, BUSY = -1, -2  # owner codes of a node that is idle and unassigned / not idle
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayConfig:
    """What to replay: the window, the allocator's settings and the admission limit.

    ``tfwd`` and ``objective`` default to the executor's (:data:`parsl_bf.allocation.
    DEFAULT_SETTINGS`: 120 s, ``speedup_balanced``, chosen by cross-validation,
    docs/policy-selection.md); ``tfwd`` is seconds here, an ``auto`` resolved by the caller
    (:func:`parsl_bf.decisions.resolve_tfwd` over the trace's holes)."""

    tfwd: float = resolve_tfwd(DEFAULT_SETTINGS.tfwd)
    objective: Objective = DEFAULT_SETTINGS.objective
    max_jobs: int = 10
    start_s: int = 0
    end_s: int | None = None  # None: the trace's end (or until every job is done)
    # The original replayer starts a task from zero nodes for free (its charge R·P(0) is 0);
    # a real fragment start pays process start-up. True: charge R_up·P(n) (``Job.start_s``·P(n)
    # where set) for a 0 → n start.
    charge_starts: bool = False
    # Buckets of the E_avail bound's LP (parsl_bf.replay.bound); 0 leaves the bound out.
    bound_buckets: int = DEFAULT_BUCKETS
    # None: the paper's single T_fwd, every node alike. A forecast: each hole has the end the
    # scheduler's plan gives it (parsl_bf.replay.holes), used as the executor uses its pilots'
    # ends: nodes leaving within ``min_node_life_s`` are not offered, and growers take the
    # longest-lived nodes first.
    holes: HoleForecast | None = None
    # Count no gain beyond a task's remaining work while no task waits for admission
    # (AllocationProblem.cap_at_remaining_work; the executor caps while tasks wait too,
    # docs/allocator.md). False: never, as the original replayer (docs/policy-selection.md,
    # "The remaining-work cap").
    cap_at_remaining_work: bool = True
    # None: the largest R_up + R_down of the running tasks (a node that leaves sooner cannot
    # repay the grow onto it and the shrink off it).
    min_node_life_s: float | None = None
    # True: a task's completion (the second its samples reach its work) is an event of its own,
    # at which its nodes are re-allocated, and so is a job's submission while a slot is free,
    # as in the executor (a fragment's end, a task's submission). False: both wait for the
    # trace's next event, as in the original replayer; a finished task's nodes train past its
    # end until then.
    task_events: bool = True
    # True: a task that loses nodes to preemption restarts once at that event, and a rescale
    # the policy orders then is part of that restart, as in the executor (a preempted fragment
    # stops and starts again at the size the allocator gives it). The policy sees no rescale
    # cost beyond the preemption's, and a grow is charged only what R_up·P(c) exceeds the
    # preemption's R_down·P(c_before) by. False: charged apart, as in the original replayer.
    restart_once: bool = True
    # Seconds of training a task pays (S·P(c)) when it loses nodes to preemption and at least
    # its ``min_nodes`` stay: the preempted ranks leave in place and the others train on, as
    # in the executor (``shrink_in_place``; a ResNet-18 shrink in place measured 0.4 s; 1 s is
    # that with a margin). Fewer left: it restarts, R_down·P(c).
    # None: every preemption restarts the task, as in the original replayer.
    preemption_shrink_s: float | None = 1.0
    # Seconds of training a planned rescale of a running task pays (·P(c)) as the executor
    # does it, in place (``shrink_in_place``, ``grow_in_place``): a shrink that keeps nodes,
    # and a grow. A grow onto nodes another task gives back at the same decision waits for
    # them at its old rate, as the executor's does until their ranks have left: this long
    # after a shrink in place, the giver's R_down after a stop. The allocator sees this cost
    # for both directions (never more than the job's R), as the executor's sees its measured
    # in-place costs. (A ResNet-18 shrank in place in 0.43 s and grew in 0.56 s,
    # docs/training.md; 1 s is that with a margin.) None: every planned rescale pays
    # R_up·P(c) or R_down·P(c), as in the original replayer.
    rescale_in_place_s: float | None = 1.0
    # The rate at which a rescale of a task holding c nodes, fewer than its min_nodes (left so
    # by a preemption), is charged. False: its rate, 0 (it trains nothing below min_nodes).
    # True: its curve's P(c) all the same, as the original replayer (jobs.py, lines 90 and 93,
    # BFTrainer/Replayer 515f0e5).
    charge_curve_below_min: bool = False


#: The ReplayConfig fields that replay the original replayer's way: completions and admissions
#: at the trace's events only, no gain ever capped at a task's remaining work, every preemption
#: a restart, a preempted task's rescale at the same event charged apart from it, and every
#: planned rescale a restart, charged at the job's curve even below its min_nodes.
#: docs/replay.md, "The original's accounting", gives each rule with the original's line.
ORIGINAL_ACCOUNTING = {
    "task_events": False,
    "cap_at_remaining_work": False,
    "restart_once": False,
    "preemption_shrink_s": None,
    "rescale_in_place_s": None,
    "charge_curve_below_min": True,
}


@dataclass
class _Task:
    job: Job
    slot: int  # its code in the node-owner array
    nodes: list[int] = field(default_factory=list)
    samples: float = 0.0
    rate: float = 0.0  # samples/s at the current count
    charge: float = 0.0  # samples lost to the last rescale, taken from the next interval
    done_s: int | None = None
    node_s: float = 0.0

    def throughput(self, n: int) -> float:
        if n < self.job.min_nodes:
            return 0.0
        return float(np.interp(n, self.job.nodes, self.job.throughput))


@dataclass(frozen=True)
class StepRow:
    """One event of the replay (a row of ``steps.csv``)."""

    t_s: int
    idle_nodes: int
    alloc_nodes: int
    active_tasks: int
    joined: int
    left: int
    preempted_tasks: int
    solved: bool
    status: str
    solve_s: float
    rescales: int
    samples: float  # cumulative, all tasks admitted so far


@dataclass
class ReplayResult:
    """Totals, per-event rows and per-task timelines of one replay."""

    summary: dict
    steps: list[StepRow]
    task_nodes: dict[str, list[tuple[int, int]]]  # task → (t, count) whenever it changes
    task_samples: dict[str, list[tuple[int, float]]]  # task → (t, cumulative samples)


def _percentile(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(xs, q)) if len(xs) else 0.0


def replay(
    trace: IdleTrace,
    jobs: Sequence[Job],
    policy: Policy,
    config: ReplayConfig = ReplayConfig(),
    progress: Callable[[int, int], None] | None = None,
    stage: Callable[[str], None] | None = None,
) -> ReplayResult:
    """Replay ``jobs`` on the idle nodes of ``trace`` with ``policy``; see the module docstring.

    ``progress(t, events)`` is called after each event (e.g. to drive a progress bar), and
    ``stage(name)`` when a stage after the events begins that may take a while: ``"bound"``,
    the E_avail bound's LPs (minutes on thousands of nodes; ``bound_buckets=0`` skips it).
    """
    end = trace.end_s if config.end_s is None else min(config.end_s, trace.end_s)
    if end <= config.start_s:
        raise ValueError(f"empty window: start {config.start_s} s, end {end} s")
    uses_work = config.objective.uses_remaining_work or config.cap_at_remaining_work
    owner = np.where(trace.initial, FREE, BUSY).astype(np.int64)
    queue = sorted(jobs, key=lambda j: j.submit_s)
    submits = [j.submit_s for j in queue]
    queued = 0  # index of the next job to admit
    active: list[_Task] = []
    finished: list[_Task] = []
    by_slot: dict[int, _Task] = {}
    steps: list[StepRow] = []
    task_nodes: dict[str, list[tuple[int, int]]] = {}
    task_samples: dict[str, list[tuple[int, float]]] = {}
    solve_times: list[float] = []
    statuses: dict[str, int] = {}
    last_problem: AllocationProblem | None = None
    last_counts: dict[str, int] = {}
    idle_node_s = alloc_node_s = done = rescale_loss = preemption_loss = 0.0
    # The same charges in node-equivalents (samples / P_j(1)), E_avail's numerator.
    rescale_norm = preemption_norm = 0.0
    rescales = preemptions = events = 0
    # Rescales by kind (start, stop, grow or shrink, in place or restarting): count, and
    # their charges in E_avail's numerator units.
    kinds: dict[str, list[float]] = {}
    hits: dict[str, list[float]] = {}  # the same for preempted tasks, by what they did
    t_prev = config.start_s
    t_end = end

    # The planned end of each idle node's hole (inf: none said, or no forecast).
    planned = np.full(len(trace.nodes), np.inf)
    plans = planned_ends(trace, config.holes) if config.holes is not None else None

    def opened(t: int, nodes: np.ndarray) -> None:
        if plans is not None:
            for x in nodes.tolist():
                planned[x] = plans.get((x, t), np.inf)

    opened(0, np.flatnonzero(trace.initial))
    # Changes before the window's start only set the initial state.
    batches = trace.batches()
    pending = next(batches, None)
    while pending is not None and pending[0] <= config.start_s:
        owner[pending[1]] = np.where(pending[2], FREE, BUSY)
        opened(pending[0], pending[1][pending[2]])
        pending = next(batches, None)

    none_changed = np.array([], dtype=np.int64), np.array([], dtype=bool)

    def task_event() -> float:
        """The next second at which a running task reaches its work, or a job is submitted
        into a free slot (inf: none, or no task events)."""
        if not config.task_events:
            return np.inf
        ends = [
            t_prev + np.ceil((x.job.work - x.samples + x.charge) / x.rate)
            for x in active
            if x.rate > 0
        ]
        if queued < len(queue) and len(active) < config.max_jobs:
            ends.append(np.ceil(queue[queued].submit_s))
        return max(t_prev + 1, min(ends)) if ends else np.inf

    def event_times():
        nonlocal pending
        yield config.start_s, *none_changed
        while True:
            t_next = pending[0] if pending is not None and pending[0] < end else end
            t_own = task_event()
            if t_own < t_next:
                yield int(t_own), *none_changed
            elif t_next < end:
                yield pending
                pending = next(batches, None)
            else:
                return

    shrink_s, in_place_s = config.preemption_shrink_s, config.rescale_in_place_s
    for t, changed, now_idle in event_times():
        events += 1
        dt = t - t_prev
        idle_before = int((owner != BUSY).sum())
        idle_node_s += dt * idle_before
        # 1. Progress since the last event; completions.
        for task in active:
            n = len(task.nodes)
            task.samples += dt * task.rate - task.charge
            task.charge = 0.0
            task.node_s += dt * n
            alloc_node_s += dt * n
        for task in [x for x in active if x.samples >= x.job.work]:
            task.samples = task.job.work
            task.done_s = t
            owner[task.nodes] = FREE
            task.nodes = []
            active.remove(task)
            finished.append(task)
            done += task.samples
            task_samples[task.job.id].append((t, task.samples))
            task_nodes[task.job.id].append((t, 0))
        # 2. Node changes: nodes taken back by the main scheduler preempt their task.
        hit: dict[int, int] = {}
        restarts: dict[str, float] = {}  # task → samples its preemption charged at this event
        gone = changed[~now_idle]
        for slot in owner[gone][owner[gone] >= 0].tolist():
            hit[slot] = hit.get(slot, 0) + 1
        lost = set(gone.tolist())
        for slot in hit:
            task = by_slot[slot]
            stay = [x for x in task.nodes if x not in lost]
            in_place = trains_on_in_place(
                len(stay), len(task.nodes) - len(stay), task.job.min_nodes,
                enabled=shrink_s is not None,
            )  # fmt: skip
            charge = (shrink_s if in_place else task.job.rescale_down_s) * task.rate
            task.samples -= charge
            preemption_loss += charge
            preemption_norm += charge / task.job.p1
            how = "in_place" if in_place else "restart_some_stay" if stay else "restart_none_stay"
            _tally(hits, how, charge / task.job.p1)
            if config.restart_once and not in_place:
                restarts[task.job.id] = charge
            task.nodes = stay
            task.rate = task.throughput(len(task.nodes))
            task_nodes[task.job.id].append((t, len(task.nodes)))
        preemptions += len(hit)
        owner[gone] = BUSY
        joined = changed[now_idle]
        owner[joined[owner[joined] == BUSY]] = FREE
        opened(t, joined)
        # 3. Admission, first come first served.
        while queued < len(queue) and queue[queued].submit_s <= t and len(active) < config.max_jobs:
            task = _Task(queue[queued], slot=len(by_slot))
            queued += 1
            by_slot[task.slot] = task
            active.append(task)
            task_nodes[task.job.id] = [(t, 0)]
            task_samples[task.job.id] = [(t, 0.0)]
        if not active and queued == len(queue):
            t_end = t
            steps.append(_row(t, owner, active, done, len(joined), len(gone), hit, None, 0, 0.0))
            break
        # 4. Allocation, when the allocator's view changed.
        free_nodes = np.flatnonzero(owner == FREE)
        life = None
        if plans is not None and active:
            life = planned - t
            floor = config.min_node_life_s
            if floor is None:
                floor = max(x.job.rescale_up_s + x.job.rescale_down_s for x in active)
            free_nodes = free_nodes[life[free_nodes] >= floor]
        solved, status, solve_s, n_rescales = False, "", 0.0, 0
        if active:
            held = sum(len(x.nodes) for x in active)
            room = sum(max(0, x.job.max_nodes) for x in active) - held
            # Nodes no task could use do not change the optimum: leave them out, so that
            # events that only move such nodes give the same problem and need no solve.
            problem = AllocationProblem(
                tasks=[
                    _as_seen(
                        x.job.task(len(x.nodes), x.job.work - x.samples if uses_work else None),
                        restarts.get(x.job.id),
                        x.rate,
                        config.rescale_in_place_s,
                    )
                    for x in active
                ],
                free_nodes=int(min(len(free_nodes), max(0, room))),
                tfwd=config.tfwd,
                objective=config.objective,
                cap_at_remaining_work=config.cap_at_remaining_work,
                # A job submitted but not admitted: every slot is taken.
                tasks_waiting=bisect.bisect_right(submits, t) > queued,
            )
            if problem != last_problem:
                result = policy(problem)
                solved, status, solve_s = True, result.status.value, result.solve_s
                solve_times.append(result.solve_s)
                statuses[status] = statuses.get(status, 0) + 1
                last_problem, last_counts = problem, dict(result.counts)
            counts = last_counts
            current = {x.job.id: x.nodes for x in active}
            if any(len(current[k]) != counts.get(k, 0) for k in current):
                value = None
                if life is not None:
                    mine = [x for nodes in current.values() for x in nodes]
                    value = {x: float(life[x]) for x in [*mine, *free_nodes.tolist()]}
                node_plan = plan(counts, current, free_nodes.tolist(), node_value=value)
                # The tasks whose rescales now are done in place if they keep nodes: all but
                # those a preemption restarts now, with in-place rescales on.
                resizes = set() if in_place_s is None else set(current) - set(restarts)
                # Releases first: another task may take these nodes, once they are free:
                # seconds from now, by node (a shrink in place, else a stop).
                freed_in: dict[int, float] = {}
                for task in active:
                    step = node_plan.tasks[task.job.id]
                    owner[list(step.release)] = FREE
                    c, n = len(task.nodes), len(step.nodes)
                    in_place = _in_place(c, n, task.job.min_nodes, task.job.id in resizes)
                    wait = in_place_s if in_place else task.job.rescale_down_s
                    freed_in |= dict.fromkeys(step.release, wait)
                for task in active:
                    step = node_plan.tasks[task.job.id]
                    c, n = len(task.nodes), len(step.nodes)
                    if n == c:
                        continue
                    n_rescales += 1
                    cost = task.job.rescale_up_s if n > c else task.job.rescale_down_s
                    rate = task.rate
                    if config.charge_curve_below_min and 0 < c < task.job.min_nodes:
                        rate = float(np.interp(c, task.job.nodes, task.job.throughput))
                    # As the executor: a running task that keeps nodes shrinks in place, and
                    # one that grows grows in place, once the nodes it takes are free (those
                    # another task gives back now, after its ranks there have left); a task
                    # that a preemption restarts now is restarting.
                    in_place = _in_place(c, n, task.job.min_nodes, task.job.id in resizes)
                    wait = max((freed_in.get(x, 0.0) for x in step.add), default=0.0)
                    if c == 0 and config.charge_starts:
                        rate = task.throughput(n)
                        cost = cost if task.job.start_s is None else task.job.start_s
                    charge = cost * rate
                    if in_place:  # and at the old rate while it waits for its new nodes
                        charge = min(cost, in_place_s) * rate + wait * (task.throughput(n) - rate)
                    if task.job.id in restarts:  # one restart: only what exceeds the preemption's
                        charge = max(0.0, charge - restarts[task.job.id])
                    task.charge += charge
                    rescale_loss += charge
                    rescale_norm += charge / task.job.p1
                    _tally(kinds, _kind(c, n, in_place, wait > 0), charge / task.job.p1)
                    owner[list(step.add)] = task.slot
                    task.nodes = list(step.nodes)
                    task.rate = task.throughput(n)
                    task_nodes[task.job.id].append((t, n))
                rescales += n_rescales
        for task in active:
            task_samples[task.job.id].append((t, task.samples))
        steps.append(
            _row(
                t,
                owner,
                active,
                done,
                len(joined),
                len(gone),
                hit,
                status,
                n_rescales,
                solve_s,
                solved,
            )
        )
        t_prev = t
        if progress is not None:
            progress(t, events)
    else:
        # The window ends: account the last interval.
        dt = end - t_prev
        idle_node_s += dt * int((owner != BUSY).sum())
        for task in active:
            task.samples = min(task.job.work, task.samples + dt * task.rate - task.charge)
            task.node_s += dt * len(task.nodes)
            alloc_node_s += dt * len(task.nodes)
            task_samples[task.job.id].append((end, task.samples))

    everyone = finished + active
    norm = sum(x.samples / x.job.p1 for x in everyone)
    samples = sum(x.samples for x in everyone)
    summary = {
        "util": alloc_node_s / idle_node_s if idle_node_s else None,
        "E_used": norm / alloc_node_s if alloc_node_s else None,
        "E_avail": norm / idle_node_s if idle_node_s else None,
        "samples": samples,
        "jobs_done": len(finished),
        "jobs_admitted": len(everyone),
        "makespan_s": (t_end - config.start_s) if queued == len(queue) and not active else None,
        "replayed_s": t_end - config.start_s,
        "idle_node_s": idle_node_s,
        "alloc_node_s": alloc_node_s,
        "events": events,
        "solves": len(solve_times),
        "solve_s": {
            "p50": _percentile(solve_times, 50),
            "p95": _percentile(solve_times, 95),
            "max": max(solve_times, default=0.0),
            "mean": float(np.mean(solve_times)) if solve_times else 0.0,
        },
        "solve_status": statuses,
        "rescales": rescales,
        "rescales_by_kind": _by_kind(kinds, idle_node_s),
        "preemptions": preemptions,
        "preemptions_by_kind": _by_kind(hits, idle_node_s),
        "rescale_loss_samples": rescale_loss,
        "preemption_loss_samples": preemption_loss,
        "E_avail_rescale_charges": rescale_norm / idle_node_s if idle_node_s else None,
        "E_avail_preemption_charges": preemption_norm / idle_node_s if idle_node_s else None,
    }
    if summary["util"] is None:
        summary["note"] = "no idle node-seconds in the window: efficiency is undefined"
    if stage is not None and config.bound_buckets > 0:
        stage("bound")
    summary.update(_bound(trace, jobs, config, end, t_end, idle_node_s, summary["E_avail"]))
    return ReplayResult(summary, steps, task_nodes, task_samples)


def _tally(counts: dict[str, list[float]], kind: str, charge: float) -> None:
    """One more ``kind``, which cost ``charge`` (samples / P(1))."""
    entry = counts.setdefault(kind, [0, 0.0])
    entry[0] += 1
    entry[1] += charge


def _by_kind(counts: dict[str, list[float]], idle_node_s: float) -> dict[str, dict]:
    """{kind: [count, charges in samples / P(1)]} as the summary shows it."""
    return {
        k: {"count": int(n), "E_avail_charges": c / idle_node_s if idle_node_s else None}
        for k, (n, c) in sorted(counts.items())
    }


def _in_place(c: int, n: int, min_nodes: int, enabled: bool) -> bool:
    """Whether a running task's planned rescale from ``c`` to ``n`` nodes is done in place: the
    executor's rule (:func:`~parsl_bf.decisions.trains_on_in_place`,
    :func:`~parsl_bf.decisions.grows_in_place`)."""
    if n < c:
        return trains_on_in_place(n, c - n, min_nodes, enabled=enabled)
    return grows_in_place(c, n - c, enabled=enabled)


def _kind(c: int, n: int, in_place: bool, waits: bool) -> str:
    """A rescale from ``c`` to ``n`` nodes, by kind: start, stop, or grow or shrink, each
    in place or a restart; a grow in place that waits for nodes given back at its decision."""
    if c == 0 or n == 0:
        return "start" if c == 0 else "stop"
    if not in_place:
        return "grow_restart" if n > c else "shrink_restart"
    return "shrink_in_place" if n < c else "grow_in_place_waits" if waits else "grow_in_place"


def _as_seen(
    spec: TaskSpec, charged: float | None, rate: float, in_place_s: float | None
) -> TaskSpec:
    """``spec`` as the allocator sees it at this event.

    A task that a preemption restarts now (``charged``: the samples that preemption cost;
    None: not hit): a grow or shrink now is part of the same restart, as in the executor, so
    only a grow whose charge R_up·P(c) exceeds ``charged`` costs the difference, a shrink
    nothing. Any other task: a rescale costs ``in_place_s`` (None: R_up, R_down), as the
    executor's allocator sees its measured in-place costs; never more than the job's own
    rescale, which a restart would cost."""
    if charged is not None:
        up = max(0.0, spec.rescale_up_s - charged / rate) if rate > 0 else 0.0
        return spec.model_copy(update={"rescale_up_s": up, "rescale_down_s": 0.0})
    if in_place_s is None:
        return spec
    up, down = min(spec.rescale_up_s, in_place_s), min(spec.rescale_down_s, in_place_s)
    return spec.model_copy(update={"rescale_up_s": up, "rescale_down_s": down})


def _bound(trace, jobs, config, end, t_end, idle_node_s, e_avail) -> dict:
    """``E_avail_bound``, ``E_avail_over_bound`` and the LP's figures for the summary."""
    if config.bound_buckets <= 0:
        return {"E_avail_bound": None, "E_avail_over_bound": None}
    profile = idle_profile(trace, config.start_s, end)
    bound = e_avail_bound(
        trace,
        jobs,
        config.start_s,
        end,
        config.bound_buckets,
        profile,
        config.max_jobs,
        config.task_events,
    )
    out = {"E_avail_bound": bound.value, "E_avail_over_bound": None, "bound": bound.to_dict()}
    # The bound divides by the idle node-seconds the replay counts: check they agree.
    counted = float(profile.node_s(t_end))
    problem = None
    if abs(counted - idle_node_s) > 1e-9 * max(1.0, idle_node_s):
        problem = f"the bound counts {counted} idle node-s to t = {t_end}, the replay {idle_node_s}"
    problem = problem or violation(e_avail, bound.value)
    if problem:
        log.error("E_avail bound: %s", problem)
        out["bound_violation"] = problem
    elif e_avail is not None and bound.value:
        out["E_avail_over_bound"] = e_avail / bound.value
    return out


def _row(
    t, owner, active, done_samples, joined, left, hit, status, rescales, solve_s, solved=False
) -> StepRow:
    return StepRow(
        t_s=int(t),
        idle_nodes=int((owner != BUSY).sum()),
        alloc_nodes=int((owner >= 0).sum()),
        active_tasks=len(active),
        joined=int(joined),
        left=int(left),
        preempted_tasks=len(hit),
        solved=solved,
        status=status or "",
        solve_s=solve_s,
        rescales=rescales,
        samples=done_samples + sum(x.samples for x in active),
    )
