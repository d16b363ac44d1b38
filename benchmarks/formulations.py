"""Which piecewise formulation the allocation MILP uses, by measurement.

Same random events (J tasks, N available nodes, curves from the bftrainer-dev job sets, objective
``throughput``), same Pyomo + GLPK, end-to-end time (build + solve + read-back):
- ``runs``: the package's model, one binary per affine run of the gain (multiple choice);
- ``points``: one binary per feasible node count (multiple choice over every count);
- ``pw-inc``/``pw-dcc``/``pw-mc``: an integer count per task, the curve as Pyomo's
  ``Piecewise`` (incremental, disaggregated convex combination, multiple choice), and big-M
  indicators for running, growing and shrinking.
Every answer is checked against the exact program. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time

import numpy as np
import pyomo.environ as pyo

from parsl_bf.allocation import Objective, gain_table, score, solve_exact, solve_milp
from parsl_bf.allocation.gains import _per_second_gain
from parsl_bf.allocation.milp import _glpk
from parsl_bf.replay import default_data_dir, load_job_set, missing_data

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from allocator import SETS, pct, random_event  # noqa: E402


def _solve(m: pyo.ConcreteModel, count) -> dict[str, int]:
    results = _glpk(60).solve(m, load_solutions=False)
    m.solutions.load_from(results)
    return count()


def points(problem):
    tables = [gain_table(t, problem) for t in problem.tasks]
    idx = [(j, k) for j, t in enumerate(tables) for k in range(len(t.counts))]
    m = pyo.ConcreteModel()
    m.x = pyo.Var(idx, domain=pyo.Binary)
    m.one = pyo.Constraint(
        range(len(tables)),
        rule=lambda m, j: sum(m.x[j, k] for k in range(len(tables[j].counts))) == 1,
    )
    m.cap = pyo.Constraint(
        expr=sum(int(tables[j].counts[k]) * m.x[j, k] for j, k in idx) <= problem.capacity
    )
    m.obj = pyo.Objective(
        expr=sum(float(tables[j].gain[k]) * m.x[j, k] for j, k in idx), sense=pyo.maximize
    )
    return _solve(
        m,
        lambda: {
            problem.tasks[j].id: int(tables[j].counts[k])
            for j, k in idx
            if pyo.value(m.x[j, k]) > 0.5
        },
    )


def piecewise(repn: str):
    def build(problem):
        tasks = problem.tasks
        jobs = range(len(tasks))
        cap = problem.capacity
        m = pyo.ConcreteModel()
        hi = [min(t.max_nodes, cap) for t in tasks]
        m.n = pyo.Var(jobs, domain=pyo.NonNegativeIntegers, bounds=lambda _, j: (0, hi[j]))
        m.f = pyo.Var(jobs)
        m.run = pyo.Var(jobs, domain=pyo.Binary)
        m.up = pyo.Var(jobs, domain=pyo.Binary)
        m.down = pyo.Var(jobs, domain=pyo.Binary)
        bps = {j: sorted({0, hi[j], *[b for b in tasks[j].nodes if b < hi[j]]}) for j in jobs}
        vals = {
            j: [
                problem.tfwd * float(v)
                for v in _per_second_gain(tasks[j], problem.objective, np.array(bps[j]))
            ]
            for j in jobs
        }
        m.curve = pyo.Piecewise(
            jobs,
            m.f,
            m.n,
            pw_pts=bps,
            f_rule=lambda _, j, x: vals[j][bps[j].index(x)],
            pw_constr_type="EQ",
            pw_repn=repn,
        )
        m.lo = pyo.Constraint(jobs, rule=lambda m, j: m.n[j] >= tasks[j].min_nodes * m.run[j])
        m.hi = pyo.Constraint(jobs, rule=lambda m, j: m.n[j] <= hi[j] * m.run[j])
        m.up_on = pyo.Constraint(
            jobs, rule=lambda m, j: m.n[j] - tasks[j].current_nodes <= cap * m.up[j]
        )
        m.down_on = pyo.Constraint(
            jobs, rule=lambda m, j: tasks[j].current_nodes - m.n[j] <= cap * m.down[j]
        )
        m.cap = pyo.Constraint(expr=sum(m.n[j] for j in jobs) <= cap)
        rate = [
            float(_per_second_gain(t, problem.objective, np.array([t.current_nodes]))[0])
            for t in tasks
        ]
        m.obj = pyo.Objective(
            expr=sum(
                m.f[j]
                - tasks[j].rescale_up_s * rate[j] * m.up[j]
                - tasks[j].rescale_down_s * rate[j] * m.down[j]
                for j in jobs
            ),
            sense=pyo.maximize,
        )
        return _solve(m, lambda: {tasks[j].id: round(pyo.value(m.n[j])) for j in jobs})

    return build


FORMULATIONS = {
    "runs": lambda p: solve_milp(p).counts,
    "points": points,
    "pw-inc": piecewise("INC"),
    "pw-dcc": piecewise("DCC"),
    "pw-mc": piecewise("MC"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="2 events per cell")
    args = ap.parse_args()
    if why := missing_data():
        print(f"error: {why}", file=sys.stderr)  # bench-quick: skipped
        return 2
    if args.quick:
        args.events = 2
    data = default_data_dir()
    jobs = [
        dataclasses.replace(j, id=f"{name}/{j.id}")
        for name in SETS
        for j in load_job_set(data / "jobs" / f"{name}.json")
    ]
    rng = random.Random(args.seed)
    cells = [(10, 64), (50, 4734), (100, 512), (100, 4734)]
    print(
        f"{'J':>4} {'N':>5} "
        + " ".join(f"{name:>14}" for name in FORMULATIONS)
        + "   (median / p95 ms)"
    )
    figures: dict[str, dict[str, float]] = {}
    exact_all, exact = True, {name: True for name in FORMULATIONS}
    for n_tasks, n_nodes in cells:
        events = [
            random_event(jobs, n_tasks, n_nodes, rng, Objective.THROUGHPUT)
            for _ in range(args.events)
        ]
        best = [solve_exact(p).objective for p in events]
        row = []
        for name, solve in FORMULATIONS.items():
            times = []
            for problem, opt in zip(events, best, strict=True):
                t0 = time.perf_counter()
                counts = solve(problem)
                times.append(time.perf_counter() - t0)
                ok = abs(score(problem, counts)[0] - opt) <= 1e-6 * max(1.0, abs(opt))
                exact[name] &= ok
                exact_all &= ok
            figures.setdefault(name, {})[f"J{n_tasks}_N{n_nodes}"] = round(pct(times, 0.95), 4)
            row.append(f"{1e3 * statistics.median(times):>6.0f} /{1e3 * pct(times, 0.95):>6.0f}")
        print(f"{n_tasks:>4} {n_nodes:>5} " + " ".join(f"{r:>14}" for r in row))
    # The package's own model ("runs") must be exact; an alternative that is not only loses.
    anomalies = [] if exact["runs"] else ["an answer of the package's model is not the optimum"]
    out = {"p95_s": figures, "all_optimal": exact_all, "exact": exact, "quick": args.quick}
    print(json.dumps(out | {"anomalies": anomalies}))
    return 1 if anomalies else 0


if __name__ == "__main__":
    sys.exit(main())
