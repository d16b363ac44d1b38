"""Hyperparameter search for the digits CNN: Latin hypercube trials, asynchronous successive
halving (ASHA).

    python workflows/hpo_sweep.py --config configs/local.yaml --trials 8
    parsl-bf run workflows/hpo_sweep.py --config configs/local.yaml --trials 8

Each trial (lr log-uniform, global batch, width, depth) is an elastic training task
(``elastic_app``) on any executor of the config. Rung r's budget is ``--min-work`` times
``--eta``**r samples in total, up to ``--max-work``. There is no barrier between rungs: a trial
goes on to the next rung as soon as it ranks among the best 1/eta of the trials that finished
its rung so far (``asha_promotions``), so nodes never wait for a rung's slowest trial. A trial
keeps one name (``hpo-<seed>-<trial>-<digest of its hyperparameters>``), its task key, so the
promoted task continues from the trial's own checkpoint and trains only the rung's extra
samples; a rerun of the sweep continues (or skips) every trial likewise. On executors that
are not BackfillExecutors a promoted trial trains again from the start.

The default budget (100,000 samples at the first rung, about 70 epochs of the digits' 1,437
training images) makes training, not process start-up, the main cost of each task: with half of
it, rank start-ups on the emulation's shared cores took about half of the nodes' time.

Writes ``leaderboard.csv`` in ``--out`` and returns (prints, as a script) the summary.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script or loaded by path: find the ``workflows`` package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workflows.common import (  # noqa: E402
    TaskResult,
    asha_promotions,
    base_parser,
    default_out,
    latin_hypercube,
    log_uniform,
    parsl_session,
    pick,
    print_table,
    rung_budgets,
    submitter,
    task_result,
    write_csv,
)

LR = (0.003, 0.5)
BATCHES = (16, 32, 64, 128)
WIDTHS = (4, 8, 16, 32)
DEPTHS = (1, 2, 3)
COLUMNS = ("rank", "trial", "lr", "global_batch", "width", "depth", "rung", "work", "accuracy")


def sample_trials(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` hyperparameter sets from a Latin hypercube over (lr, global_batch, width, depth)."""
    trials = []
    for u in latin_hypercube(n, 4, seed):
        trials.append(
            {
                "lr": round(log_uniform(u[0], *LR), 5),
                "global_batch": pick(u[1], BATCHES),
                "width": pick(u[2], WIDTHS),
                "depth": pick(u[3], DEPTHS),
            }
        )
    return trials


def trial_name(seed: int, trial: int, hyperparameters: dict[str, Any]) -> str:
    """The trial's task key across its rungs and across reruns of the sweep."""
    digest = hashlib.sha256(json.dumps(hyperparameters, sort_keys=True).encode()).hexdigest()
    return f"hpo-{seed}-{trial}-{digest[:10]}"


def leaderboard(
    trials: list[dict[str, Any]], runs: dict[int, list[tuple[int, TaskResult]]], last_rung: int
) -> list[dict[str, Any]]:
    """One row per trial, with its result at the highest rung it completed (a failure at a
    later rung keeps it), ranked by (that rung, accuracy). Status: "finished" (the last rung),
    "stopped" (not promoted), "failed" (its last run failed), "not run"."""
    rows = []
    for i, hp in enumerate(trials):
        history = runs.get(i, [])
        ok = [(rung, r) for rung, r in history if r.error is None]
        rung, result = ok[-1] if ok else (-1, None)
        if not history:
            status = "not run"
        elif history[-1][1].error is not None:
            status = "failed"
        else:
            status = "finished" if rung == last_rung else "stopped"
        rows.append(
            {
                "trial": i,
                **hp,
                "rung": None if result is None else rung,
                "work": None if result is None else result.work,
                "accuracy": None if result is None else result.accuracy,
                "status": status,
                "error": history[-1][1].error if history else None,
            }
        )
    rows.sort(
        key=lambda r: (
            r["accuracy"] is None,
            -(r["rung"] if r["rung"] is not None else -1),
            -(r["accuracy"] or 0.0),
            r["trial"],
        )
    )
    for k, row in enumerate(rows, 1):
        row["rank"] = k
    return rows


def main(argv: list[str] | None = None, config: Any = None) -> dict[str, Any]:
    parser = base_parser("hpo_sweep.py", __doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8, help="trials (default 8)")
    parser.add_argument(
        "--min-work",
        type=int,
        default=100_000,
        help="samples at the first rung (default 100000)",
    )
    parser.add_argument(
        "--max-work",
        type=int,
        default=900_000,
        help="samples at the last rung (default 900000)",
    )
    parser.add_argument("--eta", type=int, default=3, help="halving rate (default 3)")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    try:
        budgets = rung_budgets(args.min_work, args.max_work, args.eta)
    except ValueError as exc:
        parser.error(str(exc))
    out = Path(args.out) if args.out else default_out("hpo")
    out.mkdir(parents=True, exist_ok=True)

    trials = sample_trials(args.trials, args.seed)
    runs: dict[int, list[tuple[int, TaskResult]]] = {}
    history = []
    start_at = time.monotonic()
    with parsl_session(config, args.config):
        submit = submitter()
        pending: dict[Future, tuple[int, int]] = {}  # future → (trial, rung)
        done: dict[int, dict[int, float | None]] = {}  # rung → trial → accuracy (in order)
        promoted: dict[int, set[int]] = {}

        def start(i: int, rung: int) -> None:
            name = trial_name(args.seed, i, trials[i])
            options = trials[i] | {"seed": args.seed}
            pending[submit(budgets[rung], args.max_nodes, options, name=name)] = (i, rung)

        for i in range(args.trials):
            start(i, 0)
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                i, rung = pending.pop(future)
                result = task_result(future, i, budgets[rung], time.monotonic() - start_at)
                runs.setdefault(i, []).append((rung, result))
                history.append({"rung": rung, "trial": i, "work": result.work, **_outcome(result)})
                done.setdefault(rung, {})[i] = result.accuracy
            ongoing = [rung for _, rung in pending.values()]
            for i, rung in asha_promotions(done, promoted, ongoing, args.eta, len(budgets)):
                promoted.setdefault(rung - 1, set()).add(i)
                start(i, rung)
    elapsed = time.monotonic() - start_at

    rows = leaderboard(trials, runs, len(budgets) - 1)
    write_csv(out / "leaderboard.csv", [{c: r[c] for c in (*COLUMNS, "status")} for r in rows])
    write_csv(out / "history.csv", history)
    print_table(f"HPO leaderboard (rungs {budgets} samples)", rows, (*COLUMNS, "status"))
    status = [r["status"] for r in rows]
    best = next((r for r in rows if r["accuracy"] is not None), None)
    return {
        "trials": args.trials,
        "completed": status.count("finished") + status.count("stopped"),
        "finished": status.count("finished"),
        "stopped_early": status.count("stopped"),
        "failed": status.count("failed"),
        "rungs": budgets,
        "tasks": len(history),
        # Trained by this sweep: a promoted trial's rung trains only its extra samples.
        "samples": sum(h["trained"] or 0 for h in history if h["status"] == "done"),
        "best": None if best is None else {k: best[k] for k in COLUMNS if k != "rank"},
        "elapsed_s": round(elapsed, 1),
        "report": str(out),
    }


def _outcome(result: TaskResult) -> dict[str, Any]:
    o = result.outcome or {}
    resumed = o.get("resumed_samples") or 0
    return {
        "status": "failed" if result.error else "done",
        "trained": None if result.error else max(0, int(o.get("samples") or 0) - int(resumed)),
        "accuracy": result.accuracy,
        "loss": o.get("loss"),
        "world": o.get("world"),
        "seconds": round(result.seconds, 2),
        "error": result.error,
    }


if __name__ == "__main__":
    print(json.dumps(main()))
