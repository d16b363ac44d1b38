"""Replay outputs: ``summary.json``, ``steps.csv`` and PNG plots in one directory."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

from .simulator import ReplayResult, StepRow

__all__ = ["write_report", "summary_table"]


def write_report(result: ReplayResult, out_dir: str | Path, meta: dict | None = None) -> Path:
    """Write the summary, the per-event rows and the plots; returns the directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({**result.summary, **(meta or {})}, indent=2))
    names = [f.name for f in dataclasses.fields(StepRow)]
    with (out / "steps.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(names)
        for row in result.steps:
            writer.writerow([getattr(row, n) for n in names])
    _plots(result, out)
    return out


def _plots(result: ReplayResult, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = [r.t_s / 3600 for r in result.steps]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.step(hours, [r.idle_nodes for r in result.steps], where="post", label="idle nodes")
    ax.step(hours, [r.alloc_nodes for r in result.steps], where="post", label="allocated")
    ax.set(xlabel="hours", ylabel="nodes", title="Idle vs allocated nodes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "nodes.png", dpi=110)
    plt.close(fig)

    for name, series, ylabel in (
        ("tasks.png", result.task_nodes, "nodes"),
        ("samples.png", result.task_samples, "cumulative samples"),
    ):
        fig, ax = plt.subplots(figsize=(10, 4))
        for task, points in series.items():
            ax.step(
                [t / 3600 for t, _ in points],
                [v for _, v in points],
                where="post",
                label=task,
                linewidth=0.8,
            )
        ax.set(
            xlabel="hours",
            ylabel=ylabel,
            title="Nodes per task" if name == "tasks.png" else "Samples per task",
        )
        if len(series) <= 12:
            ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)


def _over_bound(summary: dict) -> float | str | None:
    """E_avail ÷ its clairvoyant bound; never a ratio above 1 (that would be a bug: flagged)."""
    if summary.get("bound_violation"):
        return "- (E_avail above its bound: a bug, see bound_violation in summary.json)"
    return summary.get("E_avail_over_bound")


def _bound_lps(summary: dict) -> str | None:
    """What the bound took (LPs solved, seconds), or why there is none."""
    lp = summary.get("bound")
    if lp is None:
        return None
    took = f"{lp['lp_solves']} / {lp['solve_s']:.1f}"
    return f"{took} ({lp['note']})" if lp.get("note") else took


def _charges(summary: dict) -> str | None:
    """The E_avail the rescale and preemption charges cost (the bound charges neither)."""
    up, pre = summary.get("E_avail_rescale_charges"), summary.get("E_avail_preemption_charges")
    return None if up is None or pre is None else f"{up:.4f} / {pre:.4f}"


def _in_place(summary: dict) -> str | None:
    """How many rescales and preemptions were done in place (the rest restarted a task, or
    started or stopped one)."""
    kinds = summary.get("rescales_by_kind"), summary.get("preemptions_by_kind")
    if None in kinds:
        return None
    rescales = sum(v["count"] for k, v in kinds[0].items() if "in_place" in k)
    return f"{rescales} / {kinds[1].get('in_place', {}).get('count', 0)}"


def summary_table(summary: dict) -> str:
    """The headline figures as an aligned two-column table."""
    rows = [
        ("util", summary["util"]),
        ("E_used", summary["E_used"]),
        ("E_avail", summary["E_avail"]),
        ("E_avail bound", summary.get("E_avail_bound")),
        ("E_avail ÷ bound", _over_bound(summary)),
        ("bound LPs / s", _bound_lps(summary)),
        ("E_avail lost: rescales / preemptions", _charges(summary)),
        ("samples", summary["samples"]),
        ("jobs done / admitted", f"{summary['jobs_done']} / {summary['jobs_admitted']}"),
        ("makespan h", None if summary["makespan_s"] is None else summary["makespan_s"] / 3600),
        ("replayed h", summary["replayed_s"] / 3600),
        ("events / solves", f"{summary['events']} / {summary['solves']}"),
        (
            "solve s p50 / p95 / max",
            "{p50:.3f} / {p95:.3f} / {max:.3f}".format(**summary["solve_s"]),
        ),
        ("solve status", ", ".join(f"{k} {v}" for k, v in summary["solve_status"].items())),
        ("rescales / preemptions", f"{summary['rescales']} / {summary['preemptions']}"),
        ("of which in place", _in_place(summary)),
    ]
    width = max(len(k) for k, _ in rows)
    lines = []
    for key, value in rows:
        if isinstance(value, float):
            value = f"{value:.4g}" if abs(value) < 1e5 else f"{value:.4e}"
        lines.append(f"{key:<{width}}  {'-' if value is None else value}")
    return "\n".join(lines)
