"""What the example workflows share: a seeded Latin hypercube, the successive-halving rule, the
Pareto front, and running a batch of elastic apps under a loaded Parsl config.

Pure helpers (no Parsl at import time), so the unit tests load this module cheaply.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, as_completed
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "TaskResult",
    "base_parser",
    "default_out",
    "dominates",
    "latin_hypercube",
    "log_uniform",
    "pareto_front",
    "parsl_session",
    "pick",
    "print_table",
    "promote",
    "rung_budgets",
    "run_tasks",
    "write_csv",
]

TASK = "parsl_bf.training.examples:digits_cnn"


# --- sampling --------------------------------------------------------------------------------


def latin_hypercube(n: int, dims: int, seed: int | None = 0) -> np.ndarray:
    """``n`` points in ``[0, 1)^dims``: in every dimension each of the ``n`` equal strata
    ``[k/n, (k+1)/n)`` holds exactly one point (a random permutation of the strata per
    dimension, a uniform jitter inside each). The same seed gives the same points."""
    if n < 1 or dims < 1:
        raise ValueError(f"need n >= 1 and dims >= 1, got n={n}, dims={dims}")
    rng = np.random.default_rng(seed)
    strata = np.stack([rng.permutation(n) for _ in range(dims)], axis=1)
    return (strata + rng.random((n, dims))) / n


def log_uniform(u: float, low: float, high: float) -> float:
    """Map ``u`` in [0, 1) to [low, high) uniformly in log space."""
    return float(math.exp(math.log(low) + u * (math.log(high) - math.log(low))))


def pick(u: float, choices: Sequence[Any]) -> Any:
    """Map ``u`` in [0, 1) to one of ``choices``, each for an equal share of the interval."""
    return choices[min(int(u * len(choices)), len(choices) - 1)]


# --- successive halving ----------------------------------------------------------------------


def rung_budgets(min_work: int, max_work: int, eta: int) -> list[int]:
    """Total samples per rung: ``min_work * eta**k`` below ``max_work``, then ``max_work``."""
    if eta < 2:
        raise ValueError(f"eta must be >= 2, got {eta}")
    if not 0 < min_work <= max_work:
        raise ValueError(f"need 0 < min_work <= max_work, got {min_work}, {max_work}")
    budgets, work = [], min_work
    while work < max_work:
        budgets.append(work)
        work *= eta
    return [*budgets, max_work]


def promote(scores: dict[Any, float | None], eta: int) -> list[Any]:
    """The trials that go on to the next rung: the best ``max(1, n // eta)`` of the ``n`` that
    ran the rung, by score (higher is better; ties go to the earlier trial in ``scores``).
    A trial without a score (it failed) is never promoted."""
    ranked = sorted(
        ((key, s) for key, s in scores.items() if s is not None and not math.isnan(s)),
        key=lambda kv: -kv[1],  # sorted() is stable: ties keep their order in ``scores``
    )
    keep = max(1, len(scores) // eta)
    return [key for key, _ in ranked[:keep]]


def asha_promotions(
    done: dict[int, dict[Any, float | None]],
    promoted: dict[int, set[Any]],
    pending: Sequence[int],
    eta: int,
    rungs: int,
) -> list[tuple[Any, int]]:
    """Asynchronous successive halving (ASHA, Li et al. 2020): the (trial, rung) pairs to start
    now. ``done[r]``: the score of every trial that finished rung r (None: it failed);
    ``promoted[r]``: trials already sent on from rung r; ``pending``: the rungs of the tasks
    still running; ``rungs``: how many there are.

    A trial goes on from rung r as soon as it ranks among the best ``n // eta`` of the ``n``
    that finished r so far, with no barrier. Once no task at rung r or below is running (no
    trial can still reach r), the best ``max(1, n // eta)`` go on, as synchronous halving
    would, so a small sweep still reaches its last rung. Ties go to the trial that finished
    the rung first; a failed trial never goes on."""
    out: list[tuple[Any, int]] = []
    running = list(pending)
    for r in range(rungs - 1):
        finished = done.get(r, {})
        if not finished:
            continue
        best = promote(finished, eta)  # the rung closed: synchronous halving's choice
        if any(p <= r for p in running):  # still open: only the sure ones
            best = best[: len(finished) // eta]
        new = [(t, r + 1) for t in best if t not in promoted.get(r, set())]
        running += [r + 1] * len(new)  # they run rung r + 1 now: it is not closed
        out += new
    return out


# --- Pareto front ----------------------------------------------------------------------------


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """``a = (accuracy, params)`` dominates ``b``: as accurate and as small, better in one."""
    return a[0] >= b[0] and a[1] <= b[1] and (a[0] > b[0] or a[1] < b[1])


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points (accuracy, params) no other point dominates (max accuracy, min
    params), by increasing params. Equal points are all on the front."""
    order = sorted(range(len(points)), key=lambda i: (points[i][1], -points[i][0]))
    front: list[int] = []
    best: tuple[float, float] | None = None  # the most accurate point seen so far
    for i in order:
        p = points[i]
        if best is None or p[0] > best[0] or p == best:
            front.append(i)
            best = p if best is None or p[0] > best[0] else best
        # else: ``best`` has params <= p's and accuracy >= p's, one of them strictly
    return front


# --- running ---------------------------------------------------------------------------------


@dataclass
class TaskResult:
    """One elastic app's outcome (``error`` set when it failed)."""

    key: Any
    work: int
    seconds: float
    outcome: dict[str, Any] | None = None
    error: str | None = None

    @property
    def accuracy(self) -> float | None:
        if self.outcome is None:
            return None
        value = self.outcome.get("metrics", {}).get("accuracy")
        return None if value is None else float(value)

    @property
    def params(self) -> float | None:
        if self.outcome is None:
            return None
        value = self.outcome.get("metrics", {}).get("params")
        return None if value is None else float(value)


def run_tasks(
    jobs: dict[Any, tuple[int, dict[str, Any]]],
    max_nodes: int,
) -> dict[Any, TaskResult]:
    """Submit one elastic app per job (key: (work, options of ``digits_cnn``)) on the loaded
    config's executors, and wait for all of them. A failed app is recorded, not raised."""
    start = time.monotonic()
    submit = submitter()
    futures: dict[Future, tuple[Any, int]] = {}
    for key, (work, options) in jobs.items():
        futures[submit(work, max_nodes, options)] = (key, work)
    results: dict[Any, TaskResult] = {}
    for future in as_completed(futures):
        key, work = futures[future]
        results[key] = task_result(future, key, work, time.monotonic() - start)
    return results


def task_result(future: Future, key: Any, work: int, seconds: float) -> TaskResult:
    """A finished app's result; a failed app (after the config's retries) is recorded."""
    try:
        return TaskResult(key, work, seconds, outcome=future.result())
    except Exception as exc:
        return TaskResult(key, work, seconds, error=f"{type(exc).__name__}: {exc}")


def submitter() -> Callable[..., Future]:
    """How to start one training task under the loaded DFK: an elastic app, which goes to the
    BackfillExecutors, or trains on one rank on any other executor. ``name``: the task's key
    across submissions (a trial sent on to a larger ``work`` continues from its checkpoint)."""
    from parsl_bf.executor.apps import elastic_app

    def submit(
        work: int, max_nodes: int, options: dict[str, Any], name: str | None = None
    ) -> Future:
        app = elastic_app(TASK, work=work, min_nodes=1, max_nodes=max_nodes, name=name)
        return app(**options)

    return submit


@contextlib.contextmanager
def parsl_session(config: Any, config_path: str | None) -> Iterator[Any]:
    """``with parsl.load(config)``; without ``config``, the one loaded from ``config_path``."""
    import parsl

    # HTEX starts interchange.py and process_worker_pool.py from PATH: this environment's.
    here = str(Path(sys.executable).parent)
    if here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(p for p in (here, os.environ.get("PATH")) if p)
    if config is None:
        if config_path is None:
            raise SystemExit("error: --config is required (or run it with `parsl-bf run`)")
        from parsl_bf.config import ConfigError, load_config

        try:
            config = load_config(config_path)
        except (ConfigError, OSError) as exc:
            raise SystemExit(f"error: {exc}") from None
    with parsl.load(config) as dfk:
        yield dfk


# --- command line and output -----------------------------------------------------------------


def base_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--config", help="parsl_bf YAML config (not needed under `parsl-bf run`, which loads it)"
    )
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument(
        "--max-nodes", type=int, default=4, help="most nodes per training task (default 4)"
    )
    parser.add_argument("--out", help="output directory (default runs/<name>-<timestamp>)")
    return parser


def default_out(name: str) -> Path:
    return Path("runs") / f"{name}-{datetime.now():%Y%m%d-%H%M%S}"


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = list(rows[0]) if rows else []
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_table(title: str, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="left" if column in ("status", "error") else "right")
    for row in rows:
        table.add_row(*(_cell(row.get(c)) for c in columns))
    console = Console()
    if not console.is_terminal:  # a log file: room for the whole table
        console = Console(width=max(console.width, 120))
    console.print(table)
