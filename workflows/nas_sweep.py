"""Architecture search for the digits CNN: accuracy against parameter count, and its Pareto front.

    python workflows/nas_sweep.py --config configs/local.yaml --candidates 12
    parsl-bf run workflows/nas_sweep.py --config configs/local.yaml

Candidates are drawn (seeded, without repeats) from the grid of depth x width x kernel; each
trains for ``--work`` samples as an elastic task (``elastic_app``) on any executor of the
config. The front keeps the candidates no other beats on both validation accuracy (higher) and
parameter count (lower). Writes ``candidates.csv`` and ``pareto.png`` in ``--out``.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script or loaded by path: find the ``workflows`` package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workflows.common import (  # noqa: E402
    base_parser,
    default_out,
    pareto_front,
    parsl_session,
    print_table,
    run_tasks,
    write_csv,
)

DEPTHS = (1, 2, 3)
WIDTHS = (4, 8, 16, 32)
KERNELS = (3, 5)
COLUMNS = ("candidate", "depth", "width", "kernel", "params", "accuracy", "pareto", "status")


def sample_candidates(n: int, seed: int) -> list[dict[str, int]]:
    """``n`` distinct architectures of the grid (all of them if ``n`` is larger), seeded."""
    grid = list(itertools.product(DEPTHS, WIDTHS, KERNELS))
    order = np.random.default_rng(seed).permutation(len(grid))[: min(n, len(grid))]
    return [dict(zip(("depth", "width", "kernel"), grid[k], strict=True)) for k in order]


def plot_front(path: Path, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["accuracy"] is not None]
    front = sorted((r for r in done if r["pareto"]), key=lambda r: r["params"])
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.scatter(
        [r["params"] for r in done],
        [r["accuracy"] for r in done],
        c="tab:gray",
        label="candidates",
    )
    ax.plot(
        [r["params"] for r in front],
        [r["accuracy"] for r in front],
        "o-",
        c="tab:red",
        drawstyle="steps-post",
        label="Pareto front",
    )
    for r in done:
        ax.annotate(
            f"d{r['depth']}w{r['width']}k{r['kernel']}",
            (r["params"], r["accuracy"]),
            textcoords="offset points",
            xytext=(4, 3),
            fontsize=7,
        )
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("validation accuracy")
    ax.set_title("digits CNN: accuracy vs size")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None, config: Any = None) -> dict[str, Any]:
    parser = base_parser("nas_sweep.py", __doc__.splitlines()[0])
    parser.add_argument(
        "--candidates", type=int, default=12, help="architectures to train (default 12, max 24)"
    )
    parser.add_argument(
        "--work", type=int, default=6000, help="samples per candidate (default 6000)"
    )
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate (default 0.05)")
    parser.add_argument("--global-batch", type=int, default=64, help="batch (default 64)")
    args = parser.parse_args(argv)
    if args.candidates < 1:
        parser.error("--candidates must be at least 1")
    out = Path(args.out) if args.out else default_out("nas")
    out.mkdir(parents=True, exist_ok=True)

    candidates = sample_candidates(args.candidates, args.seed)
    fixed = {"lr": args.lr, "global_batch": args.global_batch, "seed": args.seed}
    start = time.monotonic()
    with parsl_session(config, args.config):
        jobs = {i: (args.work, arch | fixed) for i, arch in enumerate(candidates)}
        results = run_tasks(jobs, args.max_nodes)
    elapsed = time.monotonic() - start

    rows = [
        {
            "candidate": i,
            **arch,
            "params": None if results[i].params is None else int(results[i].params),
            "accuracy": results[i].accuracy,
            "pareto": False,
            "status": "failed" if results[i].error else "done",
            "error": results[i].error,
        }
        for i, arch in enumerate(candidates)
    ]
    done = [r for r in rows if r["accuracy"] is not None and r["params"] is not None]
    for k in pareto_front([(r["accuracy"], r["params"]) for r in done]):
        done[k]["pareto"] = True
    rows.sort(key=lambda r: (r["params"] is None, r["params"] or 0, -(r["accuracy"] or 0.0)))
    write_csv(out / "candidates.csv", [{c: r[c] for c in (*COLUMNS, "error")} for r in rows])
    plot_front(out / "pareto.png", rows)
    print_table(f"NAS candidates ({args.work} samples each)", rows, COLUMNS)

    best = max(done, key=lambda r: (r["accuracy"], -r["params"]), default=None)
    keys = ("candidate", "depth", "width", "kernel", "params", "accuracy")
    return {
        "candidates": len(candidates),
        "completed": len(done),
        "failed": sum(1 for r in rows if r["status"] == "failed"),
        "best": None if best is None else {k: best[k] for k in keys},
        "pareto": [{k: r[k] for k in keys} for r in rows if r["pareto"]],
        "elapsed_s": round(elapsed, 1),
        "report": str(out),
    }


if __name__ == "__main__":
    print(json.dumps(main()))
