"""Where the gap between a replay and its E_avail bound is: the charges, or the allocation.

The bound (parsl_bf.replay.bound) gives rescales and preemptions away. So each fold is replayed
twice with the default policy (``AllocatorSettings``): as is, and with every job's R_up and
R_down set to 0 and no in-place seconds either (*free rescales*: no charge, and the allocator
weighs none). The second is the
same instance under the bound's own cost model, so its E_avail over the bound is what the
allocation alone reaches, and the difference to the first is what the charges cost, in E_avail
and in the decisions they lead to. A free-rescale E_avail above the bound would be a bug in the
bound, and is flagged like any figure that cannot be (``impossible``).

Folds: those of benchmarks/policy_cv.py; by default the three reference settings (day 0 of
hps64, imgps256, imgps1024), ``--all`` every fold. Prints a table; ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from policy_cv import impossible, make_folds, run

from parsl_bf.allocation import AllocatorSettings
from parsl_bf.replay import missing_data
from parsl_bf.replay.simulator import ReplayConfig


def _run(args: tuple) -> dict:
    """A fold replayed with the default policy; ``free``: rescales cost nothing (the bound is
    solved in the other replay only: it does not depend on the charges)."""
    fold, free = args
    settings = AllocatorSettings()
    objective = settings.objective.value
    # Free: no R_up or R_down, and no second of an in-place rescale or preemption either.
    costs = (
        (0.0, 0.0) if free else (ReplayConfig.preemption_shrink_s, ReplayConfig.rescale_in_place_s)
    )
    return run(
        fold, "milp", objective, settings.tfwd, bound=not free, free_rescales=free, costs=costs
    )


def _cell_of(flagged: bool):
    """A table cell: 4 decimals, "-" for none, "impossible" for a fold with a flagged figure."""
    return lambda x: "impossible" if flagged else ("-" if x is None else f"{x:.4f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="every fold of policy_cv (full mode)")
    ap.add_argument("--workers", type=int, default=2, help="replays at once (default 2)")
    ap.add_argument("--quick", action="store_true", help="one fold: hps, day 0")
    args = ap.parse_args()
    if why := missing_data():
        print(f"error: {why}", file=sys.stderr)  # bench-quick: skipped
        return 2
    folds = make_folds(False)
    if args.quick:
        folds = [f for f in folds if f.start_s == 0 and f.family == "hps"]
    elif not args.all:
        folds = [f for f in folds if f.start_s == 0 and f.family in ("hps", "imgps")]
    began = time.perf_counter()
    jobs = [(f, free) for f in folds for free in (False, True)]
    with ProcessPoolExecutor(args.workers) as pool:
        records = list(pool.map(_run, jobs))
    by = {(f.name, free): r for (f, free), r in zip(jobs, records, strict=True)}
    header = (
        "| fold | E_avail | charges: rescale / preemption | E_avail + charges "
        "| free rescales: E_avail | bound | ÷ bound | free ÷ bound |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    per_fold, flagged = {}, []
    for f in folds:
        real, free = by[(f.name, False)], by[(f.name, True)]
        bound = real.get("E_avail_bound")
        problems = impossible(real, bound) + impossible(free, bound)
        flagged += [f"{f.name}: {p}" for p in problems]
        charges = real["E_avail_rescale_charges"] + real["E_avail_preemption_charges"]
        row = {
            "E_avail": real["E_avail"],
            "E_avail_rescale_charges": real["E_avail_rescale_charges"],
            "E_avail_preemption_charges": real["E_avail_preemption_charges"],
            "E_avail_free_rescales": free["E_avail"],
            "E_avail_bound": bound,
            "over_bound": real["E_avail"] / bound if bound else None,
            "free_over_bound": free["E_avail"] / bound if bound else None,
        }
        # A figure that cannot be is no result: the fold reports what was wrong instead.
        per_fold[f.name] = {"impossible": problems} if problems else row
        cell = _cell_of(bool(problems))
        print(
            f"| {f.name} | {cell(row['E_avail'])} | {cell(row['E_avail_rescale_charges'])} / "
            f"{cell(row['E_avail_preemption_charges'])} | {cell(real['E_avail'] + charges)} | "
            f"{cell(row['E_avail_free_rescales'])} | {cell(bound)} | "
            f"{cell(row['over_bound'])} | {cell(row['free_over_bound'])} |"
        )
    for problem in flagged:
        print(f"IMPOSSIBLE {problem}", file=sys.stderr)
    out = {
        "benchmark": "bound_gap",
        "per_fold": per_fold,
        "impossible": flagged,
        "replays": len(records),
        "quick": args.quick,
        "wall_s": round(time.perf_counter() - began, 1),
    }
    print(json.dumps(out))
    return 1 if flagged else 0


if __name__ == "__main__":
    raise SystemExit(main())
