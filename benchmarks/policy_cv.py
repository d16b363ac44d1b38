"""Cross-validated choice of the default allocation policy (objective, T_fwd rule).

Every candidate (an objective of the MILP and a T_fwd rule) is replayed on every fold: a
setting of docs/evaluation.md (job set, node count) on one period of the dev week. A fold's
score is E_avail ÷ E_avail_bound, the share of what a clairvoyant policy could reach on that
very instance (parsl_bf.replay.bound) that the candidate reaches. The choice is tested by
leave-one-out: the candidate with the best mean score on the other folds is chosen, and scored
on the held-out one; three ways of holding out (one fold; every fold of a period of the trace;
every fold of a job set). Nothing is hard-coded: every figure comes from a replay run here.

Folds (full mode): hps-shufflenet-10J on 64 nodes run to completion (at most 72 h), the
ImageNet-imgps and -spdup sets on 256 nodes for 48 h and on 1024 nodes for 24 h, each from
the start of days 0, 2 and 4 of the week (so the hps runs, about 40 h, never overlap), with
the job set's submission times shifted to the period's start. ``--quick``: days 0 and 2, the
hps runs and the ImageNet sets on 64 nodes for 6 h, the default policy's T_fwd rule only,
2 workers (a smoke run of every code path, about a minute; its choice means nothing).

Prints a candidate × fold table, the held-out results and, per fold, the figures of the chosen
candidate against the targets; ends with one JSON line. ``--save FILE`` keeps every replay's
figures, ``--load FILE`` prints the tables again from them (same mode) without replaying. A
figure that cannot be (E_avail above its bound, an efficiency above the job set's ceiling, util
above 1) is listed under ``impossible`` and scores nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from evaluation import _fmt, table  # noqa: E402

from parsl_bf.allocation import Objective  # noqa: E402
from parsl_bf.allocation.policy import AllocatorSettings  # noqa: E402
from parsl_bf.inputs.trace import load_trace  # noqa: E402
from parsl_bf.replay import default_data_dir, load_job_set, missing_data  # noqa: E402
from parsl_bf.replay.bound import efficiency_ceiling, violation  # noqa: E402
from parsl_bf.replay.cli import seconds_or_none  # noqa: E402
from parsl_bf.replay.policies import make_policy  # noqa: E402
from parsl_bf.replay.simulator import ReplayConfig, replay  # noqa: E402

DAY = 86400
# ``weighted`` is left out: with every job's weight 1 (as in all job sets) it is ``throughput``.
OBJECTIVES = ("throughput", "balanced", "speedup", "speedup_balanced", "remaining_work", "fair")
TFWD_RULES: tuple[str | int, ...] = ("auto", 120, 1200)
# Not settings that exist, shown for what they would give and never chosen: ``balanced`` on
# each job's speedup curve P(n) / P(1) (the job's objective curve replaced by it), and
# ``speedup_balanced`` with no gain ever capped at a task's remaining work, as the original
# replayer decides (``ReplayConfig.cap_at_remaining_work`` False).
EXPLORATORY = ("balanced-speedup", "speedup_balanced-uncapped")
#: The objective each exploratory candidate replays with.
REPLAYED_AS = {"balanced-speedup": "balanced", "speedup_balanced-uncapped": "speedup_balanced"}
# The targets of issue 17 (hps: absolute; ImageNet: over equal-share; all: over the bound).
TARGET_HPS = 0.93
TARGET_OVER_EQUAL_SHARE = 0.05
TARGET_OVER_BOUND = 0.95
TOL = 1e-6  # relative: GLPK's tolerance on the bound, and float noise on efficiencies


@dataclasses.dataclass(frozen=True)
class Fold:
    """One instance: ``nodes`` first nodes, trace [start_s, start_s + length_s], ``jobs``
    submitted from start_s on; ``completion``: run until the last job is done (within it)."""

    jobs: str
    nodes: int
    start_s: int
    length_s: int
    completion: bool

    @property
    def family(self) -> str:
        """The job set's kind: ``hps``, ``imgps`` or ``spdup``."""
        return self.jobs.split("-")[0] if self.jobs.startswith("hps") else self.jobs.split("-")[1]

    @property
    def period(self) -> str:
        return f"d{self.start_s // DAY}"

    @property
    def name(self) -> str:
        return f"{self.family}{self.nodes}/{self.period}"

    @property
    def reference(self) -> bool:
        """The setting of the absolute target: hps-shufflenet-10J, 64 nodes, from t = 0."""
        return self.completion and self.start_s == 0


def candidate_name(objective: str, tfwd: str | float) -> str:
    if isinstance(tfwd, float) and tfwd.is_integer():  # AllocatorSettings keeps 120 as 120.0
        tfwd = int(tfwd)
    return f"{objective}/{tfwd}"


def make_folds(quick: bool) -> list[Fold]:
    days = (0, 2) if quick else (0, 2, 4)
    window = (6 if quick else 48) * 3600
    folds = [Fold("hps-shufflenet-10J", 64, d * DAY, 72 * 3600, True) for d in days]
    sizes = ((64, window),) if quick else ((256, window), (1024, 24 * 3600))
    for jobs in ("ImageNet-imgps-dev-501J", "ImageNet-spdup-dev-501J"):
        for nodes, length in sizes:
            folds += [Fold(jobs, nodes, d * DAY, length, False) for d in days]
    return folds


@functools.lru_cache(maxsize=4)
def _trace(nodes: int):
    return load_trace(default_data_dir() / "trace", nodes)


@functools.lru_cache(maxsize=4)
def _jobs(name: str, start_s: int, speedup_value: bool = False):
    """The job set, submitted from ``start_s`` on; ``speedup_value``: with the objective
    curve replaced by the speedup P(n) / P(1)."""
    jobs = load_job_set(default_data_dir() / "jobs" / f"{name}.json")
    out = []
    for j in jobs:
        j = dataclasses.replace(j, submit_s=j.submit_s + start_s)
        if speedup_value:
            j = dataclasses.replace(j, value=tuple(x / j.p1 for x in j.throughput))
        out.append(j)
    return tuple(out)


def run(
    fold: Fold,
    policy: str,
    objective: str,
    tfwd: str | float,
    bound: bool,
    free_rescales: bool = False,
    costs: tuple[float | None, float | None] = (
        ReplayConfig.preemption_shrink_s,
        ReplayConfig.rescale_in_place_s,
    ),
) -> dict:
    """One replay of ``fold``; ``bound``: also solve its E_avail bound (once per fold);
    ``free_rescales``: every job's R_up and R_down set to 0 (benchmarks/bound_gap.py);
    ``costs``: ReplayConfig's ``preemption_shrink_s`` and ``rescale_in_place_s`` (None: every
    preemption, or every planned rescale, restarts its task)."""
    trace = _trace(fold.nodes)
    jobs = _jobs(fold.jobs, fold.start_s, objective == "balanced-speedup")
    if free_rescales:
        jobs = tuple(
            dataclasses.replace(j, rescale_up_s=0.0, rescale_down_s=0.0, start_s=None) for j in jobs
        )
    end = fold.start_s + fold.length_s
    tfwd_s = trace.suggest_tfwd(fold.start_s, end) if tfwd == "auto" else float(tfwd)
    config = ReplayConfig(
        tfwd=tfwd_s,
        objective=Objective(REPLAYED_AS.get(objective, objective)),
        cap_at_remaining_work=objective != "speedup_balanced-uncapped",
        start_s=fold.start_s,
        end_s=end,
        preemption_shrink_s=costs[0],
        rescale_in_place_s=costs[1],
        **({} if bound else {"bound_buckets": 0}),
    )
    began = time.perf_counter()
    result = replay(trace, jobs, make_policy(policy), config)
    summary = result.summary
    return {
        **summary,
        "fold": fold.name,
        "policy": policy,
        "objective": objective,
        "tfwd": tfwd,
        "tfwd_s": tfwd_s,
        "wall_s": time.perf_counter() - began,
        "ceiling": efficiency_ceiling(jobs),
    }


def _run(args: tuple) -> dict:
    return run(*args)


def impossible(record: Mapping, bound: float | None) -> list[str]:
    """What in ``record`` (a replay's figures) cannot be, given its instance's ``bound``."""
    out = []
    if record.get("bound_violation"):
        out.append(record["bound_violation"])
    problem = violation(record.get("E_avail"), bound)
    if problem:
        out.append(problem)
    ceiling = record.get("ceiling")
    for key in ("E_avail", "E_used"):
        x = record.get(key)
        if x is not None and ceiling is not None and x > ceiling * (1 + TOL):
            out.append(f"{key} {x:.9g} above the job set's efficiency ceiling {ceiling:.9g}")
    if record.get("util") is not None and record["util"] > 1 + TOL:
        out.append(f"util {record['util']:.9g} above 1")
    return out


def score(record: Mapping, bound: float | None) -> float | None:
    """E_avail ÷ bound, or None when either is missing or the figures cannot be."""
    if record.get("E_avail") is None or not bound or impossible(record, bound):
        return None
    return record["E_avail"] / bound


def best(
    scores: Mapping[str, Mapping[str, float | None]],
    candidates: Sequence[str],
    folds: Sequence[str],
) -> str | None:
    """The candidate with the highest mean score over ``folds``; only candidates with a score
    on each of them compete; ties go to the earlier candidate of ``candidates``."""
    chosen, top = None, None
    for c in candidates:
        xs = [scores[c].get(f) for f in folds]
        if not folds or any(x is None for x in xs):
            continue
        m = statistics.fmean(xs)
        if top is None or m > top + 1e-12:
            chosen, top = c, m
    return chosen


def cross_validate(
    scores: Mapping[str, Mapping[str, float | None]],
    candidates: Sequence[str],
    groups: Mapping[str, str],
) -> dict:
    """Leave one group of folds out: for each group (``groups``: fold → group), the candidate
    :func:`best` on the other folds, and its scores on the group's folds. ``heldout_mean``: the
    mean over folds of their held-out scores (None when a held-out score is missing)."""
    out: dict = {"groups": {}, "heldout": {}}
    for g in sorted(set(groups.values())):
        train = [f for f, h in groups.items() if h != g]
        test = [f for f, h in groups.items() if h == g]
        chosen = best(scores, candidates, train)
        held = {f: (scores[chosen].get(f) if chosen else None) for f in test}
        out["groups"][g] = {"chosen": chosen, "heldout": held}
        out["heldout"].update(held)
    xs = list(out["heldout"].values())
    out["heldout_mean"] = None if any(x is None for x in xs) else statistics.fmean(xs)
    out["heldout_min"] = None if any(x is None for x in xs) else min(xs)
    counts: dict[str, int] = {}
    for v in out["groups"].values():
        if v["chosen"]:
            counts[v["chosen"]] = counts.get(v["chosen"], 0) + 1
    out["chosen_count"] = counts
    return out


def mean_ranks(
    scores: Mapping[str, Mapping[str, float | None]],
    candidates: Sequence[str],
    folds: Sequence[str],
) -> dict[str, float]:
    """Each candidate's mean rank over ``folds`` (1 = best; ties share the mean of their ranks;
    a missing score ranks last)."""
    ranks: dict[str, list[float]] = {c: [] for c in candidates}
    for f in folds:
        vals = {c: scores[c].get(f) for c in candidates}
        key = {c: (-1.0 if v is None else v) for c, v in vals.items()}
        for c in candidates:
            above = sum(1 for d in candidates if key[d] > key[c] + 1e-12)
            tied = sum(1 for d in candidates if abs(key[d] - key[c]) <= 1e-12)
            ranks[c].append(above + (tied + 1) / 2)
    return {c: statistics.fmean(r) for c, r in ranks.items()}


def _auto_tfwd(records: Sequence[Mapping], names: Sequence[str]) -> list[float]:
    """T_fwd ``auto`` in seconds per fold, if some candidate of the run used it."""
    auto = {r["fold"]: r["tfwd_s"] for r in records if r["tfwd"] == "auto"}
    return [auto[f] for f in names] if all(f in auto for f in names) else []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="2 periods, 64 nodes, 6 h windows, one T_fwd rule"
    )
    ap.add_argument("--workers", type=int, help="replays at once (default 1; quick: 2)")
    ap.add_argument("--save", type=Path, help="write every replay's figures to this JSON file")
    ap.add_argument("--load", type=Path, help="the figures of an earlier --save: no replays")
    ap.add_argument(
        "--only",
        help="replay these candidates only, comma-separated (e.g. speedup/120,"
        "speedup_balanced/auto): a partial run, whose choice is among them",
    )
    ap.add_argument(
        "--tfwd-rules",
        help="the T_fwd rules of the grid, comma-separated: auto or seconds "
        f"(default {','.join(map(str, TFWD_RULES))}; quick: the default policy's)",
    )
    ap.add_argument(
        "--preemption-shrink-s",
        type=seconds_or_none,
        default=ReplayConfig.preemption_shrink_s,
        help="what a preemption costs a task whose min_nodes stay, in seconds of its training "
        "(ReplayConfig.preemption_shrink_s; none: every preemption restarts its task, the "
        "accounting before in-place shrinks at preemption; default %(default)s)",
    )
    ap.add_argument(
        "--rescale-in-place-s",
        type=seconds_or_none,
        default=ReplayConfig.rescale_in_place_s,
        help="what a planned rescale done in place costs a running task, in seconds of its "
        "training (ReplayConfig.rescale_in_place_s; none: every planned rescale restarts its "
        "task, the accounting before in-place rescales; default %(default)s)",
    )
    args = ap.parse_args()
    if not args.load and (why := missing_data()):
        print(f"error: {why}", file=sys.stderr)  # bench-quick: skipped
        return 2
    folds = make_folds(args.quick)
    args.workers = args.workers or (2 if args.quick else 1)
    if args.tfwd_rules is None:
        # quick: the default's own rule, so that the default in force is among the candidates
        quick_rule = candidate_name("", AllocatorSettings().tfwd).lstrip("/")
        args.tfwd_rules = quick_rule if args.quick else ",".join(map(str, TFWD_RULES))
    costs = (args.preemption_shrink_s, args.rescale_in_place_s)
    try:
        rules = [x if x == "auto" else int(x) for x in args.tfwd_rules.split(",")]
    except ValueError:
        ap.error(f"--tfwd-rules: {args.tfwd_rules!r}: each rule is auto or whole seconds")
    grid = [(o, t) for o in OBJECTIVES + EXPLORATORY for t in rules]
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {candidate_name(o, t) for o, t in grid}
        if unknown:
            ap.error(f"--only: unknown candidates {sorted(unknown)}")
        grid = [(o, t) for o, t in grid if candidate_name(o, t) in wanted]
    default = AllocatorSettings()
    current = candidate_name(default.objective.value, default.tfwd)
    candidates = [candidate_name(o, t) for o, t in grid if o not in EXPLORATORY]
    extra = [candidate_name(o, t) for o, t in grid if o in EXPLORATORY]
    if current in candidates:  # ties go to the default in force
        candidates.remove(current)
        candidates.insert(0, current)
    began = time.perf_counter()
    if args.load:
        saved = json.loads(args.load.read_text())
        base, records, wall = saved["base"], saved["records"], saved["wall_s"]
    else:
        with ProcessPoolExecutor(args.workers) as pool:
            equal = [(f, "equal-share", "throughput", 10, True, False, costs) for f in folds]
            base = list(pool.map(_run, equal))
            jobs = [(f, "milp", o, t, False, False, costs) for f in folds for o, t in grid]
            records = list(pool.map(_run, jobs))
        wall = time.perf_counter() - began
    if args.save:
        args.save.write_text(json.dumps({"base": base, "records": records, "wall_s": wall}))
    print(f"{len(base) + len(records)} replays in {wall:.0f} s", file=sys.stderr)

    bounds = {f.name: b["E_avail_bound"] for f, b in zip(folds, base, strict=True)}
    equal = {f.name: b["E_avail"] for f, b in zip(folds, base, strict=True)}
    names = [f.name for f in folds]
    flagged = []
    for r in base + records:
        for problem in impossible(r, bounds[r["fold"]]):
            flagged.append(
                {
                    "fold": r["fold"],
                    "policy": r["policy"],
                    "objective": r["objective"],
                    "tfwd": r["tfwd"],
                    "problem": problem,
                }
            )
    by = {(r["fold"], candidate_name(r["objective"], r["tfwd"])): r for r in records}
    scores = {c: {f: score(by[(f, c)], bounds[f]) for f in names} for c in candidates + extra}

    schemes = {
        "fold": {f: f for f in names},
        "period": {f.name: f.period for f in folds},
        "job_set": {f.name: f.family for f in folds},
    }
    cv = {k: cross_validate(scores, candidates, g) for k, g in schemes.items()}
    chosen = best(scores, candidates, names)
    ranks = mean_ranks(scores, candidates, names)
    # What the rule would give if the exploratory objective existed.
    what_if = cross_validate(scores, candidates + extra, schemes["fold"]) if extra else None

    mode = ("quick" if args.quick else "full") + (f", only {args.only}" if args.only else "")
    lines = [
        f"# Policy cross-validation ({mode} mode): E_avail ÷ E_avail_bound per candidate × fold",
        "",
        "Folds: "
        + ", ".join(
            f"{f.name} = {f.jobs} on {f.nodes} nodes from {f.start_s // 3600} h, "
            + ("to completion (≤ " if f.completion else "")
            + f"{f.length_s // 3600} h"
            + (")" if f.completion else "")
            for f in folds
        ),
        "",
        "| candidate | " + " | ".join(names) + " | mean | min | mean rank | job-set mean |",
        "|---|" + "---|" * (len(names) + 4),
    ]
    bad = {(x["fold"], candidate_name(x["objective"], x["tfwd"])) for x in flagged}
    # Each job set weighing the same (the table's mean weighs each fold the same).
    families = sorted({f.family for f in folds})
    family_mean = {}
    for c in candidates + extra:
        per = [[scores[c][f.name] for f in folds if f.family == k] for k in families]
        ok = all(x is not None for xs in per for x in xs)
        family_mean[c] = statistics.fmean(statistics.fmean(xs) for xs in per) if ok else None
    for c in candidates + extra:
        xs = [scores[c][f] for f in names]
        ok = [x for x in xs if x is not None]
        cells = " | ".join(
            ("IMPOSSIBLE" if (f, c) in bad else "n/a") if x is None else f"{x:.3f}"
            for f, x in zip(names, xs, strict=True)
        )
        label = " (current default)" if c == current else ""
        label += " (exploratory, not selectable)" if c in extra else ""
        rank = f"{ranks[c]:.2f}" if c in ranks else "-"
        lines.append(
            f"| {c}{label} | {cells} "
            f"| {_fmt(statistics.fmean(ok) if len(ok) == len(xs) else None)} "
            f"| {_fmt(min(ok) if len(ok) == len(xs) else None)} | {rank} "
            f"| {_fmt(family_mean[c])} |"
        )
    lines += [
        "| equal-share (E_avail) | " + " | ".join(f"{equal[f]:.3f}" for f in names) + " | | | | |",
        "| bound (E_avail_bound) | " + " | ".join(_fmt(bounds[f]) for f in names) + " | | | | |",
        *(
            ["| T_fwd auto, s | " + " | ".join(f"{x:.0f}" for x in auto_s) + " | | | | |"]
            if (auto_s := _auto_tfwd(records, names))
            else []
        ),
        "",
        "## Leave one out (choose on the other folds by mean score, test on the held-out ones)",
        "",
        "| held out | groups | chosen per group (times) | held-out mean | held-out min |",
        "|---|---|---|---|---|",
    ]
    for k, res in cv.items():
        times = ", ".join(f"{c} ({n})" for c, n in sorted(res["chosen_count"].items()))
        lines.append(
            f"| one {k.replace('_', ' ')} | {len(res['groups'])} | {times} "
            f"| {_fmt(res['heldout_mean'])} | {_fmt(res['heldout_min'])} |"
        )
    lines += ["", "Held-out score per fold:", ""]
    lines += ["| fold | " + " | ".join(cv) + " |", "|---|" + "---|" * len(cv)]
    for f in names:
        cells = []
        for res in cv.values():
            picked = next(v["chosen"] for v in res["groups"].values() if f in v["heldout"])
            cells.append(f"{_fmt(res['heldout'][f])} ({picked})")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    if what_if:
        lines += [
            "",
            f"With the exploratory {', '.join(extra)} selectable too, leaving one fold out: "
            "chosen "
            + ", ".join(f"{c} ({n})" for c, n in sorted(what_if["chosen_count"].items()))
            + f"; held-out mean {_fmt(what_if['heldout_mean'])}, "
            f"min {_fmt(what_if['heldout_min'])}.",
        ]

    def targets(c: str, title: str) -> tuple[list[str], dict]:
        """The figures of candidate ``c`` per fold, against the targets."""
        out = [
            "",
            f"## {title}: {c}",
            "",
            *table(
                [
                    by[(f, c)] | {"E_avail_bound": bounds[f], "E_avail_over_bound": scores[c][f]}
                    for f in names
                ]
            ),
            "",
            "| fold | E_avail | E_used | target | met | ÷ bound | ≥ 0.95 | at time limit "
            "| all met |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        rows = {}
        for f in folds:
            r = by[(f.name, c)]
            at_limit = r["solve_status"].get("feasible", 0) + r["solve_status"].get("fallback", 0)
            ratio = scores[c][f.name]
            need = None  # an E_avail the target asks for, where it names one
            if f.reference:
                want = f"E_avail, E_used ≥ {TARGET_HPS}"
                hit = r["E_avail"] >= TARGET_HPS and (r["E_used"] or 0) >= TARGET_HPS
            elif f.completion:  # the absolute target is the reference setting's only
                want = "-"
                hit = True
            else:
                want = f"E_avail ≥ equal-share {equal[f.name]:.3f} + {TARGET_OVER_EQUAL_SHARE}"
                need = equal[f.name] + TARGET_OVER_EQUAL_SHARE
                hit = r["E_avail"] >= need
            # No policy reaches more than the bound: a target above it cannot be met.
            beyond = need is not None and bounds[f.name] is not None and need > bounds[f.name]
            near = ratio is not None and ratio >= TARGET_OVER_BOUND
            met = bool(hit and near and not at_limit)
            rows[f.name] = {
                "E_avail": r["E_avail"],
                "E_used": r["E_used"],
                "E_avail_bound": bounds[f.name],
                "over_bound": ratio,
                "equal_share": equal[f.name],
                "tfwd_s": r["tfwd_s"],
                "jobs_done": r["jobs_done"],
                "at_time_limit": at_limit,
                "target_met": bool(hit),
                "target_above_bound": beyond,
                "met": met,
            }
            out.append(
                f"| {f.name} | {_fmt(r['E_avail'])} | {_fmt(r['E_used'])} | {want} "
                f"| {'yes' if hit else 'no: above the bound' if beyond else 'no'} "
                f"| {_fmt(ratio)} | {'yes' if near else 'no'} "
                f"| {at_limit} | {'yes' if met else 'no'} |"
            )
        met = sum(v["met"] for v in rows.values())
        hits = sum(v["target_met"] for v in rows.values())
        above = sum(v["target_above_bound"] for v in rows.values())
        out += [
            "",
            f"Own target (E_avail/E_used or equal-share + {TARGET_OVER_EQUAL_SHARE}) met on "
            f"{hits} of {len(rows)} folds; all targets on {met}. On {above} folds the own "
            "target is above the E_avail bound: no policy can meet it there.",
        ]
        return out, rows

    target_rows: dict = {}
    met_count: dict[str, int] = {}
    shown = [(chosen, "Chosen on all folds")] if chosen else []
    if current in candidates and current != chosen:
        shown.append((current, "Current default"))
    if extra:
        top = max(extra, key=lambda c: statistics.fmean(x or 0.0 for x in scores[c].values()))
        shown.append((top, "Best exploratory (not an existing setting)"))
    for c, title in shown:
        more, rows = targets(c, title)
        lines += more
        met_count[c] = sum(v["met"] for v in rows.values())
        if c == chosen:
            target_rows = rows
    if flagged:
        lines += ["", "## IMPOSSIBLE figures (not scored)", ""]
        lines += [
            f"- {x['fold']} {x['policy']} {x['objective']}/{x['tfwd']}: {x['problem']}"
            for x in flagged
        ]
    print("\n".join(lines))
    objective, _, tfwd = (chosen or "/").partition("/")
    print(
        json.dumps(
            {
                "mode": mode,
                "preemption_shrink_s": costs[0],
                "rescale_in_place_s": costs[1],
                "chosen": {"objective": objective, "tfwd": tfwd} if chosen else None,
                "current_default": current,
                "chosen_mean": statistics.fmean(scores[chosen].values()) if chosen else None,
                "heldout_mean": cv["fold"]["heldout_mean"],
                "heldout": {
                    k: {
                        "mean": v["heldout_mean"],
                        "min": v["heldout_min"],
                        "chosen_count": v["chosen_count"],
                    }
                    for k, v in cv.items()
                },
                "per_fold": target_rows,
                "targets_met": {c: f"{n} / {len(folds)}" for c, n in met_count.items()},
                "scores": scores,
                "mean_rank": ranks,
                "job_set_mean": family_mean,
                "impossible": flagged,
                "exploratory": {
                    "candidates": extra,
                    "heldout_mean_if_selectable": what_if["heldout_mean"] if what_if else None,
                    "chosen_count_if_selectable": what_if["chosen_count"] if what_if else None,
                },
                "replays": len(base) + len(records),
                "wall_s": round(wall, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
