"""A clairvoyant upper bound on a replay's ``E_avail``: how much is left to gain on an instance.

The instance is the trace window [t0, t_end], the jobs and their curves. A replay reports
``E_avail = N / D(t_stop)``, where N = Σ_j samples_j / P_j(1) (samples capped at the work,
P_j(1) the curve interpolated at one node), D(t) the idle node-seconds in [t0, t] and t_stop the
event at which the last job finished, or t_end. The bound is the value of a linear program that
keeps only capacity and job availability and gives everything else away:

* the whole future of idle nodes is known;
* rescales, starts and preemptions are free, and nodes are fungible (no node identity);
* a job may run from s_j, when the replay could admit it at the earliest: its submission (or the
  window's start), as every second may hold an event (a completion, a submission); without task
  events, the first event (the window's start or a trace change) at or after it (a job
  submitted after the last event is never admitted and counts nothing, in the replay as here);
  of the first-come-first-served ``max_jobs`` limit only "at most ``max_jobs`` admitted at
  once" is kept, and only when it is below the number of jobs (dropping more only enlarges the
  feasible set);
* node counts are averaged over buckets: the window is cut at B+1 times a_0 = t0 < ... <
  a_B = t_end (the trace's steps merged bottom-up where the idle count changes least, see
  :func:`_edges`, with the s_j kept as edges when there are few jobs).

**The LP.** Let f_j be the upper concave hull of the points (0, 0) and (n, P_j(n)) for
min_j ≤ n ≤ max_j (P_j: the curve as the replay interpolates it; 0 below min_j, which the hull
through the origin covers). f_j is piecewise linear with segments q of width w_jq and slopes
σ_j1 > σ_j2 > ... > 0 (flat or falling pieces dropped; pieces below 1e-7·σ_j1 folded into the
last one kept, which only raises f_j: the LP stays a relaxation, and well scaled). In bucket b,
C_b = D(a_{b+1}) − D(a_b) (exact, from the trace's steps) and A_jb = |[max(a_b, s_j), a_{b+1}]|
is the time job j is available in it. Variables y_jbq ≥ 0 are the node-seconds job j spends on
segment q in b:

    N*(T) = max  Σ_jbq y_jbq·σ_jq / P_j(1)
            s.t. y_jbq ≤ w_jq·A_jb                (at most max_j nodes while available)
                 Σ_jq y_jbq ≤ C_b                 (capacity of the bucket)
                 Σ_bq y_jbq·σ_jq ≤ W_j            (samples capped at the work)

with the buckets cut off at a horizon T (the bucket holding T shortened to end at T).

*With an admission limit* K = ``max_jobs`` < J: at every instant at most K jobs are admitted,
so the nodes in use are at most min(idle(t), M_K), M_K the K widest hulls together (C_b is
then that clipped count's integral), and job j is admitted τ_jb ≤ A_jb seconds of bucket b,
with Σ_j τ_jb ≤ K·L_b and y_jbq ≤ w_jq·τ_jb in place of w_jq·A_jb (Jensen over the admitted
time; a job makes no progress unless admitted). The queue's order is kept in part too: at a few
bucket ends e (:data:`QUEUE_CHECKPOINTS`), z_j ∈ [0, 1] relaxes "job j admitted by e", falling
along the queue (first come first served), 0 before s_j and never falling from one checkpoint
to the next; x_j is j's share of its work done by e, at most z_j; and Σ_j (z_j − x_j) ≤ K, as a
job leaves its slot only when done. Without this the LP would fill the slots with the
best-scaling jobs of the whole queue and never admit the others; with it, the work done is, up
to K jobs, the work of a prefix of the queue. And as an admitted job holds its slot until done,
in every bucket b after a checkpoint e the jobs admitted by e and not done by b's end are
admitted all of b: τ_jb ≥ L_b·(z_j(e) − x_j(b)), summed over a class (below) with its done
members counted by its samples. Without this the LP could admit a job, leave its slot to
another for a while, and come back to it.

*Pooling.* When one column set per job would pass :data:`MAX_VARIABLES`, jobs with the same
curve and node range share one: y_cbq ≤ w_q·Σ_{j∈c} A_jb (the perspective A·f(m / A) of a
concave f is superadditive, so splitting a class's node-seconds among its members cannot beat
it), and the class's samples up to the end of bucket b are at most the work of its members
submitted by then. The queue's terms see a class's samples S_c only: at most Σ_{j∈c} W_j·z_j,
and Σ_{j∈c} x_j ≤ S_c / min_{j∈c} W_j. Every per-job solution sums to a pooled one, so pooling
only relaxes; on the dev week's identical jobs it gives the same value. If that is still too
large, the buckets are coarsened.

**Why it bounds every replay.** Take any replay and let n_j(t) be job j's node count (an integer
in {0} ∪ [1, max_j], constant between events, zero before s_j). Its samples in
bucket b are at most g_jb = ∫_b P_j(n_j(t)) dt (rescale and preemption charges only subtract,
and completion caps samples at W_j). With m_jb = ∫_b n_j dt over the A_jb seconds it is
available, Jensen's inequality on the concave f_j ≥ P_j gives g_jb ≤ A_jb·f_j(m_jb / A_jb),
and Σ_j m_jb ≤ C_b because at every instant Σ_j n_j(t) ≤ idle(t). Filling the hull segments in
order of slope up to min(W_j, Σ_b g_jb) samples per job is then a feasible point using at most
m_jb node-seconds, with objective ≥ N. So N ≤ N*(T) for the replay's t_stop = T. Coarser
buckets only average more (a relaxation), so any bucketing gives a bound. With a limit, run the
same argument over the τ_jb seconds job j is admitted in b, and with min(n_j(t), h_j) nodes
(h_j: where f_j stops rising, beyond which it gains nothing): Σ_j min(n_j(t), h_j) ≤
min(idle(t), M_K) as at most K jobs are admitted. For the queue, let each job's samples by
bucket b be min(W_j, Σ_{b' ≤ b} g_jb') (the fill above, bucket by bucket): a job done by e has
x_j = 1, one not yet admitted has none, so with z_j its admission (0 or 1, a prefix of the
queue, never falling in time) Σ_j (z_j − x_j) counts at most the jobs admitted and not done at
e, at most K; and a job admitted by e and not done by the end of b (z_j = 1, x_j < 1) is
admitted all of b, τ_jb = L_b, while for the others L_b·(z_j − x_j) ≤ 0.

**The denominator.** It is the replay's own D(t_stop), which depends on when the policy
finishes. If the relaxation cannot finish every job by t_end, no replay stops early and the
bound is N*(t_end) / D(t_end). If it can, a replay that finishes all the work at t_stop has
N = W = Σ_j W_j / P_j(1) and E_avail = W / D(t_stop) with t_stop no earlier than T*, the
relaxation's earliest finish, so W / D(T*) bounds it (and N*(t_end) / D(t_end) = W / D(t_end)
bounds a replay that does not finish early). T* is found by bisection over the buckets with
N*(a_{k+1}) ≥ W, then one more LP inside the bucket k found: its length λ·L_k and capacity c are
variables, with c held above the convex minorant of the bucket's cumulative idle node-seconds
(a relaxation of "the prefix [a_k, a_k + λ·L_k] of the bucket"), minimising D(a_k) + c, so
D(a_k) + c* ≤ D(T*), and the bound is W / (D(a_k) + c*) (the larger of it and
N*(t_end) / D(t_end)). Without task events a replay notices completions at trace events
only, so t_stop is an event (or t_end) with D(t_stop) ≥ D(T*): the denominator is then D(e) for
the first such event e with D(e) ≥ D(a_k) + c*.
"Every job finishes" is tested leniently (N* ≥ W·(1 − 1e-6)), which can only move T* earlier.

**Its ceiling.** Every node-second yields at most ρ_j = max_n P_j(n) / (n·P_j(1)) normalised
samples (the first hull slope over P_j(1)), so E_avail and its bound are at most
max_j ρ_j: 1 for curves that never beat linear scaling from one node (P_j(n) ≤ n·P_j(1)),
above 1 only for superlinear curves. The bound is clipped to that ceiling (itself a bound).

Solved with GLPK through Pyomo, as the allocation MILP (:mod:`parsl_bf.allocation.milp`);
GLPK's feasibility tolerance is 1e-7 (relative), so a replay may exceed the bound by that much
without a bug; :func:`violation` allows 1e-6. Only proven optima are used: a failed or timed
out LP gives no bound (or, inside the bisection, the last bucket's start), never a wrong one.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyomo.environ as pyo
from pyomo.common.errors import ApplicationError
from pyomo.opt import TerminationCondition

from ..allocation.errors import SolverUnavailableError
from ..allocation.milp import _glpk
from ..inputs.trace import IdleTrace
from .jobsets import Job

__all__ = [
    "DEFAULT_BUCKETS",
    "Bound",
    "IdleProfile",
    "concave_hull",
    "e_avail_bound",
    "efficiency_ceiling",
    "idle_profile",
    "violation",
]

log = logging.getLogger(__name__)

#: Buckets of the default grid (the dev week on 64 nodes: some 40 minutes each).
DEFAULT_BUCKETS = 240
#: The LP's hull columns are kept below this: identical jobs are pooled, then buckets
#: coarsened. 100 jobs of distinct curves on 64 nodes for a week: 117,718 variables at 240
#: buckets took 400 s for their 9 LPs, at 60 buckets (36,000) 26 s, for a bound 0.0036 higher.
#: Every job set of docs/evaluation.md stays under it at 240 buckets (ImageNet: 16,500).
MAX_VARIABLES = 50_000
#: Buckets are never coarsened below this (for size, or after a time-out).
MIN_BUCKETS = 8
#: "Every job finishes" is tested as N* ≥ W·(1 − SLACK): lenient, so a bound is never lost to
#: round-off (a lenient test only moves T* earlier, which raises the bound).
SLACK = 1e-6
#: A hull piece whose slope is below this share of the job's steepest is folded into the one
#: before it (see :func:`concave_hull`).
NEGLIGIBLE_SLOPE = 1e-7
#: How far above the bound a replay's E_avail may lie before it is called a bug.
TOLERANCE = 1e-6
#: With an admission limit, the queue's order is checked at about this many bucket ends (each
#: adds a variable per job submitted by then; any subset of checkpoints gives a valid bound).
#: 8 against 4: ImageNet bounds 0.0004-0.0036 lower, for twice the LP time (30 s on 1,024
#: nodes over 24 h); 16 ran past the time limit there.
QUEUE_CHECKPOINTS = 8
#: The queue's variables (checkpoints × jobs) are kept below this: fewer checkpoints for more
#: jobs, none past it (10,000 jobs get 2; a job set may hold up to a million).
QUEUE_VARIABLES = 25_000
#: GLPK's limit per LP, seconds (4,734 nodes over 48 h: 10 LPs, 174 s); a time-out of the first LP
#: solves it again with half the buckets, down to :data:`MIN_BUCKETS`, then gives no bound, never
#: a wrong one (only proven optima are used).
LP_TIME_LIMIT = 120.0


@dataclass(frozen=True)
class IdleProfile:
    """Idle node count as a step function of time over a window, as the replay counts it."""

    times: np.ndarray  # t0 = times[0] < ... < times[-1] = window end
    counts: np.ndarray  # idle nodes on [times[i], times[i+1])
    cumulative: np.ndarray  # idle node-seconds from t0 to times[i]

    def node_s(self, t: float | np.ndarray) -> np.ndarray | float:
        """Idle node-seconds from the window start to ``t`` (exact: linear between steps)."""
        return np.interp(t, self.times, self.cumulative)


def idle_profile(trace: IdleTrace, start_s: int, end_s: int) -> IdleProfile:
    """The idle counts of ``trace`` in [start_s, end_s], with the replay's conventions.

    State changes at or before ``start_s`` set the initial state; a node both taken and freed in
    one batch ends idle (as in the simulator); the last step runs to ``end_s``.
    """
    state = trace.initial.copy()
    times, counts = [float(start_s)], []
    for t, nodes, idle in trace.batches():
        if t >= end_s:
            break
        if t > start_s:
            counts.append(int(state.sum()))
            times.append(float(t))
        state[nodes[~idle]] = False
        state[nodes[idle]] = True
    counts.append(int(state.sum()))
    times.append(float(end_s))
    t = np.array(times)
    c = np.array(counts, dtype=np.int64)
    cumulative = np.concatenate(([0.0], np.cumsum(np.diff(t) * c)))
    return IdleProfile(t, c, cumulative)


def _hull(pts: list[tuple[float, float]], upper: bool = False) -> list[tuple[float, float]]:
    """The lower convex (``upper``: upper concave) hull of points sorted by x."""
    sign = -1.0 if upper else 1.0
    out: list[tuple[float, float]] = []
    for q in pts:
        while len(out) >= 2:
            (x1, y1), (x2, y2) = out[-2], out[-1]
            if sign * ((x2 - x1) * (q[1] - y1) - (y2 - y1) * (q[0] - x1)) <= 0:
                out.pop()
            else:
                break
        out.append(q)
    return out


def concave_hull(job: Job) -> tuple[np.ndarray, np.ndarray]:
    """Widths (nodes) and slopes (samples/s per node) of the rising pieces of f_j.

    f_j is the upper concave hull through (0, 0) of the job's throughput at the counts the replay
    may give it, {0} ∪ [min_nodes, max_nodes]. The curve is linear between integer breakpoints,
    so the hull of its vertices (with min and max) is the hull of all those counts.
    """
    lo, hi = job.min_nodes, job.max_nodes
    xs = sorted({lo, hi} | {n for n in job.nodes if lo < n < hi})
    pts = [(0.0, 0.0)] + [(float(x), float(np.interp(x, job.nodes, job.throughput))) for x in xs]
    h = np.array(_hull(pts, upper=True))
    widths, slopes = np.diff(h[:, 0]), np.diff(h[:, 1]) / np.diff(h[:, 0])
    # Slopes fall along a concave hull, so the negligible pieces are its tail. Their samples are
    # folded into the last piece kept (f then only rises, and saturates sooner: the bound stays
    # an upper bound); kept, a slope 1e-16 of its neighbour's stalls GLPK's simplex.
    keep = slopes > NEGLIGIBLE_SLOPE * slopes.max(initial=0.0)
    if keep.any() and not keep.all():
        last = int(np.flatnonzero(keep)[-1])
        tail = ~keep & (slopes > 0)
        slopes[last] += float((widths[tail] * slopes[tail]).sum()) / widths[last]
    return widths[keep], slopes[keep]


def efficiency_ceiling(jobs: Sequence[Job]) -> float:
    """max_j max_n P_j(n) / (n·P_j(1)): no E_avail, nor its bound, can exceed it (1 if linear
    scaling from one node is never beaten)."""
    best = 0.0
    for job in jobs:
        _, slopes = concave_hull(job)
        p1 = job.p1
        if len(slopes) and p1 > 0:
            best = max(best, float(slopes[0]) / p1)
    return best


@dataclass(frozen=True)
class Bound:
    """The bound and what it took; ``value`` is None when it could not be computed (``note``)."""

    value: float | None
    idle_node_s: float  # the denominator: D(t_end), or D at the earliest possible stop
    finish_s: float | None  # earliest time a replay may stop, all done; None: t_end
    buckets: int = 0
    checkpoints: int = 0  # of the queue's order (:data:`QUEUE_CHECKPOINTS`); 0: none
    variables: int = 0  # of the largest LP solved
    constraints: int = 0
    solves: int = 0
    solve_s: float = 0.0  # building and solving the LPs
    note: str | None = None

    def to_dict(self) -> dict:
        out = {
            "idle_node_s": self.idle_node_s,
            "finish_s": self.finish_s,
            "buckets": self.buckets,
            "queue_checkpoints": self.checkpoints,
            "variables": self.variables,
            "constraints": self.constraints,
            "lp_solves": self.solves,
            "solve_s": round(self.solve_s, 3),
        }
        if self.note:
            out["note"] = self.note
        return out


def violation(e_avail: float | None, bound: float | None) -> str | None:
    """A message when ``e_avail`` exceeds ``bound`` beyond solver tolerance: a bug somewhere."""
    if e_avail is None or bound is None:
        return None
    if e_avail > bound * (1 + TOLERANCE) + 1e-12:
        return (
            f"E_avail {e_avail:.9g} exceeds its upper bound {bound:.9g}: a bug in the replay's "
            "accounting or in the bound (parsl_bf.replay.bound)"
        )
    return None


class _Unsolved(Exception):
    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out  # GLPK stopped at LP_TIME_LIMIT: a smaller LP may solve


@dataclass
class _Classes:
    """The admitted jobs, grouped into classes that share one LP column set.

    A class is one job, or (when one column per job is too many) all jobs with the same curve
    and node range: their samples are then pooled, which relaxes the per-job work caps to a
    cap per class on what its members submitted so far (see :class:`_Instance`).
    """

    members: list[np.ndarray]  # job indices
    submit: np.ndarray  # s_j, per job (the jobs are in the replay's queue order)
    work: np.ndarray  # W_j, per job
    inv_p1: np.ndarray  # 1 / P(1), per class
    widths: list[np.ndarray]  # hull pieces, per class
    slopes: list[np.ndarray]


def _lines(hull: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(intercept, slope) of each piece of a piecewise-linear hull."""
    return [
        (y1 - (y2 - y1) / (x2 - x1) * x1, (y2 - y1) / (x2 - x1))
        for (x1, y1), (x2, y2) in zip(hull, hull[1:], strict=False)
    ]


class _Instance:
    """The buckets and job classes of one bound; builds and solves its LPs.

    Class c (one job, or identical jobs pooled) has A_cb = Σ_{j∈c} A_jb job-seconds available in
    bucket b; y_cbq ≤ w_q·A_cb (the perspective of a concave f is superadditive, so pooling
    members is a relaxation), and its samples up to the end of bucket b are at most the work of
    its members submitted by then.

    With ``slots`` (the replay's ``max_jobs``, when fewer than the jobs), at most that many jobs
    are admitted at any instant, so (i) the nodes in use never exceed the ``slots`` largest hull
    widths together (the capacity is the idle count clipped there, step by step) and (ii) each
    class gets τ_cb ≤ A_cb job-seconds of admission in bucket b with Σ_c τ_cb ≤ slots·L_b and
    y_cbq ≤ w_q·τ_cb (Jensen's inequality over the time a job is admitted).
    """

    def __init__(
        self,
        profile: IdleProfile,
        jobs: _Classes,
        edges: np.ndarray,
        slots: int | None,
        checkpoints: int,
    ) -> None:
        self.profile = profile
        self.jobs = jobs
        self.edges = edges  # a_0 .. a_B
        self.slots = slots
        self.checkpoints = checkpoints  # of the queue's order, with slots (0: none)
        usable = profile.counts.astype(float)
        if slots is not None:
            each = [float(w.sum()) for c, w in enumerate(jobs.widths) for _ in jobs.members[c]]
            usable = np.minimum(usable, sum(sorted(each, reverse=True)[:slots]))
        self.usable = np.concatenate(([0.0], np.cumsum(np.diff(profile.times) * usable)))
        self.unit = max(1.0, float(np.diff(self.usable_s(edges)).max()))  # node-s per LP unit
        self.solves = 0
        self.solve_s = 0.0
        self._began = 0.0
        self.variables = 0
        self.constraints = 0

    def usable_s(self, t):
        """Node-seconds the jobs can use from the window start to ``t``."""
        return np.interp(t, self.profile.times, self.usable)

    def max_samples(self, horizon: float) -> float:
        """N*(horizon): the most normalised samples, in node-seconds."""
        self._began = time.perf_counter()
        m, rows = self._model(horizon, final=False)
        m.obj = pyo.Objective(
            expr=sum(
                self.jobs.inv_p1[c] * self.jobs.slopes[c][q] * m.y[i]
                for i, (c, _, q, _) in enumerate(rows)
            ),
            sense=pyo.maximize,
        )
        self._solve(m)
        return pyo.value(m.obj) * self.unit

    def min_finish_capacity(self, k: int, total: float) -> float:
        """The fewest idle node-seconds D(a_k) + c in which bucket k's prefix finishes all work."""
        self._began = time.perf_counter()
        m, rows = self._model(float(self.edges[k + 1]), final=True)
        u = self.unit
        m.finish = pyo.Constraint(
            expr=sum(
                self.jobs.inv_p1[c] * self.jobs.slopes[c][q] * u / total * m.y[i]
                for i, (c, _, q, _) in enumerate(rows)
            )
            >= 1 - SLACK
        )
        m.obj = pyo.Objective(expr=m.c, sense=pyo.minimize)
        self._solve(m)
        return float(self.profile.node_s(self.edges[k])) + pyo.value(m.c) * u

    def _model(self, horizon: float, final: bool) -> tuple[pyo.ConcreteModel, list]:
        """The constraints of N*(horizon); with ``final``, the last bucket is a variable prefix.

        In the final bucket k, of length L_k: λ ∈ [0, 1] is the prefix's share of it, c its idle
        node-seconds (held above the convex minorant of the cumulative idle node-seconds at
        λ·L_k), the node-seconds used at most c and the concave majorant of the usable ones, and
        a class's job-seconds there at most n_ck·λ·L_k for its n_ck members available in the
        bucket (relaxing Σ_j (λ·L_k − d_j)^+ for members submitted d_j into the bucket).
        """
        a, u, jobs = self.edges, self.unit, self.jobs
        starts = a[:-1][a[:-1] < horizon]
        ends = np.minimum(a[1 : len(starts) + 1], horizon)
        caps = (self.usable_s(ends) - self.usable_s(starts)) / u
        rows: list[tuple[int, int, int, float]] = []  # (class, bucket, piece, bound in node-s)
        pairs: list[tuple[int, int, float, int]] = []  # (class, bucket, job-s available, jobs)
        released: list[list[tuple[int, float]]] = []  # per class: (bucket, work submitted by)
        for c, members in enumerate(jobs.members):
            # By sorted submission times, not a members × buckets matrix: a class may pool
            # hundreds of thousands of jobs.
            order = np.argsort(jobs.submit[members], kind="stable")
            s, work = jobs.submit[members][order], jobs.work[members][order]
            whole = np.searchsorted(s, starts, side="right")  # there all of the bucket
            present = np.searchsorted(s, ends, side="left")  # there some of it (s < its end)
            since = np.concatenate(([0.0], np.cumsum(s)))
            total = (
                whole * (ends - starts) + (present - whole) * ends - (since[present] - since[whole])
            )
            for b in np.flatnonzero(present > 0).tolist():
                pairs.append((c, b, float(total[b]), int(present[b])))
                for q, w in enumerate(jobs.widths[c].tolist()):
                    rows.append((c, b, q, w * float(total[b])))
            # Work submitted by the end of each bucket; a cap only where the next bucket adds.
            by = np.concatenate(([0.0], np.cumsum(work)))[present]
            released.append(
                [(b, float(by[b])) for b in range(len(ends) - 1) if by[b] < by[b + 1]]
                + [(len(ends) - 1, float(work.sum()))]
            )
        last = len(starts) - 1
        length = float(ends[-1] - starts[-1])
        m = pyo.ConcreteModel()
        m.y = pyo.Var(range(len(rows)), bounds=lambda _, i: (0.0, rows[i][3] / u))
        if final:
            m.lam = pyo.Var(bounds=(0.0, 1.0))
            m.c = pyo.Var(bounds=(0.0, None))
        by_bucket: dict[int, list[int]] = {}
        by_class: dict[int, list[int]] = {}
        for i, (c, b, _, _) in enumerate(rows):
            by_bucket.setdefault(b, []).append(i)
            by_class.setdefault(c, []).append(i)
        m.capacity = pyo.Constraint(
            sorted(by_bucket),
            rule=lambda m, b: (
                sum(m.y[i] for i in by_bucket[b]) <= (m.c if final and b == last else caps[b])
            ),
        )
        # Work: one cap per job; a pooled class's samples run through cumulative variables
        # S_cb = Σ_{b' ≤ b} samples (units of its work), capped where its members arrive.
        # With an admission limit every class keeps cumulative samples: the queue's checkpoints
        # (below) bound them bucket by bucket.
        single = [c for c in sorted(by_class) if len(jobs.members[c]) == 1 and self.slots is None]
        m.work = pyo.Constraint(
            single,
            rule=lambda m, c: (
                sum(
                    jobs.slopes[c][rows[i][2]] * u / released[c][-1][1] * m.y[i]
                    for i in by_class[c]
                )
                <= 1
            ),
        )
        pooled = [c for c in sorted(by_class) if c not in single]
        steps = [(c, b) for c in pooled for b in range(len(ends))]
        m.cum = pyo.Var(steps, bounds=(0.0, 1.0))
        by_class_bucket: dict[tuple[int, int], list[int]] = {}
        for i, (c, b, _, _) in enumerate(rows):
            by_class_bucket.setdefault((c, b), []).append(i)
        m.running = pyo.Constraint(
            steps,
            rule=lambda m, c, b: (
                m.cum[c, b]
                == (m.cum[c, b - 1] if b else 0)
                + sum(
                    jobs.slopes[c][rows[i][2]] * u / released[c][-1][1] * m.y[i]
                    for i in by_class_bucket.get((c, b), [])
                )
            ),
        )
        arrivals = [(c, b, w / released[c][-1][1]) for c in pooled for b, w in released[c][:-1]]
        m.arrived = pyo.Constraint(
            range(len(arrivals)),
            rule=lambda m, n: m.cum[arrivals[n][0], arrivals[n][1]] <= arrivals[n][2],
        )
        if final:
            p = self.profile
            a_k = float(starts[-1])
            inside = p.times[(p.times > a_k) & (p.times < a_k + length)]
            xs = np.concatenate(([a_k], inside, [a_k + length]))
            x = (xs - a_k).tolist()
            idle = list(zip(x, (p.node_s(xs) - p.node_s(a_k)).tolist(), strict=True))
            usable = list(zip(x, (self.usable_s(xs) - self.usable_s(a_k)).tolist(), strict=True))
            low, high = _lines(_hull(idle)), _lines(_hull(usable, upper=True))
            m.idle = pyo.Constraint(
                range(len(low)),
                rule=lambda m, i: m.c >= (low[i][0] + low[i][1] * length * m.lam) / u,
            )
            m.usable = pyo.Constraint(
                range(len(high)),
                rule=lambda m, i: (
                    sum(m.y[r] for r in by_bucket.get(last, []))
                    <= (high[i][0] + high[i][1] * length * m.lam) / u
                ),
            )
        present = {(c, b): n for c, b, _, n in pairs}
        if self.slots is None:
            if final:  # y ≤ w·n_ck·λ·L_k in the last bucket
                m.prefix = pyo.Constraint(
                    by_bucket.get(last, []),
                    rule=lambda m, i: (
                        m.y[i]
                        <= jobs.widths[rows[i][0]][rows[i][2]]
                        * present[rows[i][0], last]
                        * length
                        / u
                        * m.lam
                    ),
                )
            return m, rows
        # Admission slots: τ_cb (in units of the longest bucket) per available (class, bucket).
        scale = float(np.max(ends - starts))
        index = {(c, b): n for n, (c, b, _, _) in enumerate(pairs)}
        m.tau = pyo.Var(range(len(pairs)), bounds=lambda _, n: (0.0, pairs[n][2] / scale))
        m.admitted = pyo.Constraint(
            range(len(rows)),
            rule=lambda m, i: (
                m.y[i]
                <= jobs.widths[rows[i][0]][rows[i][2]]
                * scale
                / u
                * m.tau[index[rows[i][0], rows[i][1]]]
            ),
        )
        by_pair_bucket: dict[int, list[int]] = {}
        for n, (_, b, _, _) in enumerate(pairs):
            by_pair_bucket.setdefault(b, []).append(n)
        m.slots = pyo.Constraint(
            sorted(by_pair_bucket),
            rule=lambda m, b: (
                sum(m.tau[n] for n in by_pair_bucket[b])
                <= self.slots
                * (
                    length / scale * m.lam
                    if final and b == last
                    else float(ends[b] - starts[b]) / scale
                )
            ),
        )
        if final:
            m.prefix = pyo.Constraint(
                by_pair_bucket.get(last, []),
                rule=lambda m, n: m.tau[n] <= pairs[n][3] * length / scale * m.lam,
            )
        if self.checkpoints:
            self._queue(m, ends, pooled, index, scale, final)
        return m, rows

    def _queue(
        self,
        m: pyo.ConcreteModel,
        ends: np.ndarray,
        pooled: list[int],
        index: dict[tuple[int, int], int],
        scale: float,
        final: bool,
    ) -> None:
        """First come first served, at checkpoints: at most ``slots`` jobs admitted and not done.

        At a checkpoint e (a bucket's end), z_j ∈ [0, 1] stands for "job j admitted by e" and
        x_j for its share of the work done by e. The replay admits in queue order, so z falls
        along the queue (z_j ≥ z_{j+1}) and is 0 for a job not yet submitted; a job has samples
        only once admitted (a class's samples are at most Σ_{j∈c} W_j·z_j); and it leaves its
        slot only when done, so Σ_j (z_j − x_j) ≤ slots. With Σ_{j∈c} x_j ≤ S_c / min_{j∈c} W_j
        (S_c: the class's samples by e) this is linear in the class's cumulative samples.
        Without it the LP would give the slots to the best-scaling jobs of the whole queue and
        never admit the others, which no first-come-first-served replay can do. A job admitted
        stays so until done: z never falls from one checkpoint to the next, and in each bucket b
        after a checkpoint e, a class is admitted at least L_b·(Σ_{j∈c} z_j(e) − S_c(b) /
        min_{j∈c} W_j) seconds (its jobs admitted by e less those done by b's end).
        """
        jobs = self.jobs
        nb = len(ends)
        step = max(1, nb // self.checkpoints)
        checks = sorted({*range(step - 1, nb, step), nb - 1})
        total = {c: float(jobs.work[jobs.members[c]].sum()) for c in pooled}
        least = {c: float(jobs.work[jobs.members[c]].min()) for c in pooled}
        # The jobs submitted by a checkpoint are a prefix of the queue: 0 .. known[b] − 1.
        known = {b: int(np.count_nonzero(jobs.submit <= ends[b])) for b in checks}
        m.z = pyo.Var([(b, j) for b in checks for j in range(known[b])], bounds=(0.0, 1.0))
        m.fcfs = pyo.Constraint(
            [(b, j) for b in checks for j in range(1, known[b])],
            rule=lambda m, b, j: m.z[b, j] <= m.z[b, j - 1],
        )
        m.admitted_work = pyo.Constraint(
            [(b, c) for b in checks for c in pooled],
            rule=lambda m, b, c: (
                m.cum[c, b]
                <= sum(
                    float(jobs.work[j]) / total[c] * m.z[b, j]
                    for j in jobs.members[c][jobs.members[c] < known[b]].tolist()
                )
            ),
        )
        m.in_slots = pyo.Constraint(
            checks,
            rule=lambda m, b: (
                sum(m.z[b, j] for j in range(known[b]))
                - sum(total[c] / least[c] * m.cum[c, b] for c in pooled)
                <= self.slots
            ),
        )
        # The first ``slots`` jobs submitted by the window's start are admitted at it (the
        # replay's first event), and a job admitted stays so until done: z never falls from one
        # checkpoint to the next.
        first = min(self.slots, int(np.count_nonzero(jobs.submit <= self.edges[0])))
        for b in checks:
            for j in range(first):
                m.z[b, j].setlb(1.0)
        stays = [
            (e, f, j) for e, f in zip(checks, checks[1:], strict=False) for j in range(known[e])
        ]
        m.stays = pyo.Constraint(
            range(len(stays)),
            rule=lambda m, n: m.z[stays[n][0], stays[n][2]] <= m.z[stays[n][1], stays[n][2]],
        )
        # Holding: the jobs admitted by the last checkpoint e before bucket b (by the window's
        # start, before the first) that are not done by b's end are admitted all of b. (The
        # last bucket of ``final`` is cut at λ: left out.)
        # (Through one sum per checkpoint and class, not one per bucket: with thousands of
        # jobs the latter would repeat thousands of terms in every bucket.)
        holds, early = [], {}
        for b in range(nb - 1 if final else nb):
            e = max((x for x in checks if x < b), default=None)
            for c in pooled:
                if (c, b) not in index:
                    continue
                members = jobs.members[c]
                if (e, c) not in early:
                    early[e, c] = members[members < (first if e is None else known[e])].tolist()
                if early[e, c]:
                    holds.append((e, b, c))
        sums = [(e, c) for (e, c), js in early.items() if e is not None and js]
        m.admitted_by = pyo.Var(sums, bounds=(0.0, None))
        m.admitted_sum = pyo.Constraint(
            sums, rule=lambda m, e, c: m.admitted_by[e, c] == sum(m.z[e, j] for j in early[e, c])
        )

        def held(m, n):
            e, b, c = holds[n]
            admitted = len(early[e, c]) if e is None else m.admitted_by[e, c]
            not_done = admitted - total[c] / least[c] * m.cum[c, b]
            length = float(ends[b] - (ends[b - 1] if b else self.edges[0]))
            return m.tau[index[c, b]] * scale >= length * not_done

        m.holding = pyo.Constraint(range(len(holds)), rule=held)

    def _solve(self, m: pyo.ConcreteModel) -> None:
        began = self._began  # set when the model's building began
        self.variables = max(self.variables, m.nvariables())
        self.constraints = max(self.constraints, m.nconstraints())
        try:
            results = _glpk(LP_TIME_LIMIT).solve(m, load_solutions=False)
        except ApplicationError as exc:
            raise _Unsolved(f"GLPK failed: {exc}") from None
        finally:
            self.solves += 1
            self.solve_s += time.perf_counter() - began
        cond = results.solver.termination_condition
        if cond is not TerminationCondition.optimal or len(results.solution) == 0:
            raise _Unsolved(f"GLPK: {cond}", cond is TerminationCondition.maxTimeLimit)
        m.solutions.load_from(results)


def _edges(profile: IdleProfile, submits: np.ndarray, buckets: int) -> np.ndarray:
    """At most about ``buckets`` buckets that follow the idle count closely.

    Starts from the trace's steps (plus the admission times, kept as edges when there are few
    jobs) and merges neighbours bottom-up, cheapest first, where merging costs the squared
    error it adds to a step-function fit of the idle count (L_a·L_b / (L_a + L_b)·(μ_a − μ_b)²).
    Any edges give a valid bound; these keep it close to the bound on the trace's own steps.
    """
    t = profile.times
    start, end = float(t[0]), float(t[-1])
    keep = set()
    if len(submits) <= buckets // 2:
        keep = {float(x) for x in submits if start < x < end}
    edges = np.unique(np.concatenate((t, sorted(keep))))
    if len(edges) - 1 <= buckets:
        return edges
    n = len(edges) - 1
    length = np.diff(edges).tolist()
    cap = np.diff(profile.node_s(edges)).tolist()
    right = list(range(1, n + 1))  # the next live segment (n: none)
    left = list(range(-1, n - 1))
    version = [0] * n  # bumped whenever a segment grows: older heap entries are stale
    pinned = [float(edges[i + 1]) in keep for i in range(n)]  # the edge after i must stay

    def entry(i: int) -> tuple[float, int, int, int, int]:  # merge i with its right neighbour
        j = right[i]
        d = cap[i] / length[i] - cap[j] / length[j]
        return (
            length[i] * length[j] / (length[i] + length[j]) * d * d,
            i,
            j,
            version[i],
            version[j],
        )

    heap = [entry(i) for i in range(n - 1) if not pinned[i]]
    heapq.heapify(heap)
    live = n
    while live > buckets and heap:
        _, i, j, vi, vj = heapq.heappop(heap)
        if right[i] != j or version[i] != vi or version[j] != vj:
            continue
        length[i] += length[j]
        cap[i] += cap[j]
        pinned[i] = pinned[j]
        right[i] = right[j]
        version[i] += 1
        version[j] = -1  # gone
        if right[i] < n:
            left[right[i]] = i
        live -= 1
        if right[i] < n and not pinned[i]:
            heapq.heappush(heap, entry(i))
        if left[i] >= 0 and not pinned[left[i]]:
            heapq.heappush(heap, entry(left[i]))
    out, i = [edges[0]], 0
    while i < n:
        i = right[i]
        out.append(edges[i])
    return np.array(out)


def e_avail_bound(
    trace: IdleTrace,
    jobs: Sequence[Job],
    start_s: int = 0,
    end_s: int | None = None,
    buckets: int = DEFAULT_BUCKETS,
    profile: IdleProfile | None = None,
    max_jobs: int | None = None,
    task_events: bool = True,
) -> Bound:
    """The upper bound on E_avail of any replay of ``jobs`` on ``trace`` in the window.

    ``submit_s`` of a job counts from t = 0 of the trace, as in the replay (jobs submitted before
    ``start_s`` are available from it). ``profile``: :func:`idle_profile` of the window, if the
    caller has it. ``max_jobs``: the replay's admission limit (None: none); it tightens the
    bound when it is below the number of jobs. ``task_events``: as the replay's
    (``ReplayConfig.task_events``); False, its events are the trace's changes only, which
    tightens the bound. See the module docstring for the LP and the argument.
    """
    end = trace.end_s if end_s is None else min(end_s, trace.end_s)
    if profile is None:
        profile = idle_profile(trace, start_s, end)
    total_idle = float(profile.cumulative[-1])
    if total_idle <= 0:
        return Bound(None, 0.0, None, note="no idle node-seconds in the window")
    # The replay's queue: by submission, ties in the given order (a stable sort, as it sorts).
    jobs = sorted(jobs, key=lambda j: j.submit_s)
    # A job is admitted at the first event at or after its submission, or never when none is
    # left in the window: it then counts nothing. Without task events the events are the
    # window's start and the trace's changes; with them, any second may be one.
    submits = np.array([j.submit_s for j in jobs], dtype=float)
    if task_events:
        ok = submits < end
        admit_s = np.maximum(submits[ok], float(start_s))
    else:
        events = profile.times[:-1]
        at = np.searchsorted(events, submits, side="left")
        ok = at < len(events)
        admit_s = events[at[ok]]
    never = int(np.count_nonzero(~ok))
    jobs = [j for j, keep in zip(jobs, ok.tolist(), strict=True) if keep]
    if not jobs:
        return Bound(0.0, total_idle, None)
    if any(j.p1 <= 0 for j in jobs):
        return Bound(None, total_idle, None, note="a curve is 0 at one node: E_avail undefined")
    hulls = [concave_hull(j) for j in jobs]
    submit = admit_s.astype(float)
    slots = max_jobs if max_jobs is not None and max_jobs < len(jobs) else None
    # No more buckets than the trace's steps and the admission times can cut (_edges).
    n = max(1, min(buckets, len(profile.times) - 1 + len(jobs)))
    segments = sum(len(h[1]) for h in hulls)
    per_row = 1 if slots is None else 2  # rows of y ≤ w·τ as well
    members = [np.array([i]) for i in range(len(jobs))]
    if segments * n * per_row > MAX_VARIABLES:  # too many columns: pool identical jobs
        kinds: dict[tuple, list[int]] = {}
        for i, j in enumerate(jobs):
            kinds.setdefault((j.nodes, j.throughput, j.min_nodes, j.max_nodes), []).append(i)
        members = [np.array(x) for x in kinds.values()]
        segments = sum(len(hulls[int(x[0])][1]) for x in members)
    while n > MIN_BUCKETS and segments * n * per_row > MAX_VARIABLES:  # then coarsen buckets
        n //= 2
    checkpoints = min(QUEUE_CHECKPOINTS, QUEUE_VARIABLES // len(jobs)) if slots else 0
    data = _Classes(
        members=members,
        submit=submit,
        work=np.array([j.work for j in jobs], dtype=float),
        inv_p1=np.array([1.0 / jobs[int(x[0])].p1 for x in members]),
        widths=[hulls[int(x[0])][0] for x in members],
        slopes=[hulls[int(x[0])][1] for x in members],
    )
    ceiling = efficiency_ceiling(jobs)
    inst = _Instance(profile, data, _edges(profile, submit, n), slots, checkpoints)

    def done(value: float | None, denominator: float, finish: float | None, note=None) -> Bound:
        if value is not None:
            value = min(value, ceiling)
        return Bound(
            value,
            denominator,
            finish,
            len(inst.edges) - 1,
            checkpoints,
            inst.variables,
            inst.constraints,
            inst.solves,
            inst.solve_s,
            note,
        )

    while True:
        try:
            at_end = inst.max_samples(float(end))
            break
        except _Unsolved as exc:
            # Coarser buckets only average more (still a bound) and make a smaller LP: on an
            # instance larger than any measured here, a looser bound beats none.
            if not exc.timed_out or n <= MIN_BUCKETS:
                log.warning("no E_avail bound: %s", exc)
                return done(None, total_idle, None, str(exc))
            n = max(MIN_BUCKETS, n // 2)
            log.warning("E_avail bound: %s; solving again with %d buckets", exc, n)
            spent = inst.solves, inst.solve_s
            inst = _Instance(profile, data, _edges(profile, submit, n), slots, checkpoints)
            inst.solves, inst.solve_s = spent
        except SolverUnavailableError as exc:
            log.warning("no E_avail bound: %s", exc)
            return done(None, total_idle, None, str(exc))
    bound = at_end / total_idle
    total = float(sum(data.work[x].sum() * data.inv_p1[c] for c, x in enumerate(members)))
    last_submit = float(data.submit.max())
    if never or at_end < total * (1 - SLACK):
        return done(bound, total_idle, None)
    # Every job can finish within the window: W / D(T*) bounds the replays that stop early.
    edges = inst.edges
    lo = int(np.searchsorted(edges, last_submit, side="right")) - 1  # bucket of the last submit
    hi = len(edges) - 2  # finishes by edges[hi + 1] = end
    try:
        while lo < hi:  # smallest k whose end edges[k + 1] lets every job finish
            mid = (lo + hi) // 2
            if inst.max_samples(float(edges[mid + 1])) >= total * (1 - SLACK):
                hi = mid
            else:
                lo = mid + 1
        denominator = inst.min_finish_capacity(lo, total)
    except _Unsolved as exc:  # keep the bucket's start: T* > edges[lo] is already shown
        log.warning("E_avail bound: the last LP failed, using the bucket's start: %s", exc)
        denominator = float(profile.node_s(edges[lo]))
    if task_events:  # the replay stops at the first second it may: D(t_stop) ≥ D(T*)
        stop = float(np.interp(denominator, profile.cumulative, profile.times))
    else:
        # Completions are noticed at trace events only: the replay stops at the first event (a
        # trace change, or the window's end) whose idle node-seconds reach the relaxation's.
        stops = profile.times[1:]
        first = int(np.searchsorted(profile.cumulative[1:], denominator * (1 - TOLERANCE)))
        stop = float(stops[min(first, len(stops) - 1)])
        denominator = float(profile.node_s(stop))
    if denominator <= 0:
        return done(None, total_idle, None, "the relaxation finishes in no time")
    return done(max(bound, total / denominator), denominator, stop)
