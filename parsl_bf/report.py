"""The report of a ``parsl-bf run``: ``report.md`` (summary, per-task table, executor status),
``summary.json``, ``tasks.csv``, ``timeline.csv`` and ``nodes.png`` in one directory."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["Sample", "task_columns", "task_rows", "write_report"]

# Parsl task states, grouped as the progress display shows them.
STATE_GROUPS = {
    "queued": ("unsched", "pending", "fail_retryable"),
    "running": ("launched", "running", "running_ended", "joining"),
    "done": ("exec_done", "memo_done"),
    "failed": ("failed", "dep_fail"),
}


@dataclass
class Sample:
    """One look at the run by the progress thread."""

    t: float  # seconds since the run started
    queued: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    pilots: int = 0  # running pilots of the providers that keep ``pilots``
    pilot_nodes: int = 0  # their nodes
    in_use: int | None = None  # nodes the BackfillExecutors' tasks hold (status snapshots)
    idle: int | None = None  # nodes of their pilots that no task holds
    rate: float | None = None  # samples/s, summed over their tasks
    preemptions: int | None = None  # counted by the BackfillExecutors


def group_counts(counts: dict[Any, int]) -> dict[str, int]:
    """DFK ``task_state_counts`` (States → n) as queued / running / done / failed."""
    by_name = {getattr(state, "name", str(state)): n for state, n in counts.items()}
    return {g: sum(by_name.get(s, 0) for s in names) for g, names in STATE_GROUPS.items()}


def _options(options: Any) -> str:
    if not isinstance(options, dict):
        return ""
    return " ".join(f"{k}={v}" for k, v in options.items())


def _training_name(rec: dict[str, Any], spec: dict[str, Any]) -> str | None:
    """The user's training code for an ``elastic_app`` task (its record's function is always
    ``train_in_process``): the short name of its ``task`` (``module:function``)."""
    args = rec.get("args") or ()
    task = spec.get("task") or (args[0] if args else None)
    if not isinstance(task, str) or not task:
        return None
    return task.rpartition(":")[2] or task


def task_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per DFK task record: app, executor, state, tries, time, and for training tasks
    (``elastic_app`` or its one-rank fallback) the work, options and outcome, with the task's
    own metrics (whatever keys its ``evaluate`` returned) under ``metrics``. An
    ``elastic_app`` task is named by its training function (``digits_cnn``), not by the
    ``train_in_process`` wrapper every such task runs."""
    rows = []
    for rec in sorted(records, key=lambda r: r.get("id", 0)):
        spec = rec.get("resource_specification") or {}
        args = rec.get("args") or ()
        work, options = spec.get("work"), spec.get("options")
        app = rec.get("func_name")
        if app == "train_in_process" and len(args) >= 3:
            options, work = args[1], args[2] if work is None else work
            app = _training_name(rec, spec) or app
        invoked, returned = rec.get("time_invoked"), rec.get("time_returned")
        row: dict[str, Any] = {
            "task": rec.get("id"),
            "app": app,
            "executor": rec.get("executor"),
            "state": getattr(rec.get("status"), "name", str(rec.get("status"))),
            "tries": rec.get("try_id", 0) + 1,
            "seconds": round((returned - invoked).total_seconds(), 2)
            if invoked and returned
            else None,
            "work": work,
            "options": _options(options),
            "samples": None,
            "world": None,
            "loss": None,
            "metrics": {},
            "error": None,
        }
        future = rec.get("app_fu")
        if future is not None and future.done():
            exc = future.exception()
            if exc is not None:
                row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            elif isinstance(result := future.result(), dict):
                row["samples"] = result.get("samples")
                row["world"] = result.get("world")
                row["loss"] = result.get("loss")
                metrics = result.get("metrics")
                row["metrics"] = dict(metrics) if isinstance(metrics, dict) else {}
        rows.append(row)
    return rows


def metric_column(key: str) -> str:
    """The column of metric ``key``: the key itself, unless a fixed column has that name
    (``loss`` is the final training loss; an evaluation ``loss`` is ``metrics.loss``)."""
    return f"metrics.{key}" if key in TASK_COLUMNS or key == "metrics" else key


def _before_error(extra: list[str]) -> list[str]:
    # The error, long, stays last: the metrics sit with the rest of the outcome.
    return [c for c in TASK_COLUMNS if c != "error"] + extra + ["error"]


def task_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The fixed columns, with one per metric key any row carries (in first-seen order)
    before ``error``."""
    keys = dict.fromkeys(k for r in rows for k in r.get("metrics") or {})
    return _before_error([metric_column(k) for k in keys])


def _flat_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with each metric in its own column."""
    metrics = row.get("metrics") or {}
    return row | {metric_column(k): v for k, v in metrics.items()}


def _metrics_text(metrics: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_cell(v)}" for k, v in metrics.items())


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        value = json.dumps(value, default=str)
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def plot_nodes(
    samples: list[Sample], path: Path, split: dict[str, list[float]] | None = None
) -> bool:
    """Nodes (pilots' and in use) and tasks over time; False when there is nothing to plot.
    ``split`` (seconds ``t`` since the run's start, and ``offered``, ``training`` and
    ``start_up`` nodes at each, from the event log) adds where the pilots' node-time went."""
    have_status = any(s.in_use is not None for s in samples)
    have_pilots = any(s.pilot_nodes for s in samples)
    if len(samples) < 2 or not (have_status or have_pilots):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    t = [s.t for s in samples]
    rows = 3 if split and len(split.get("t", [])) > 1 else 2
    fig, axes = plt.subplots(rows, 1, figsize=(8, 2.75 * rows), sharex=True)
    top, bottom = axes[0], axes[-1]
    if rows == 3:
        mid = axes[1]
        parts = zip(split["offered"], split["training"], split["start_up"], strict=True)
        lost = [max(0.0, o - a - b) for o, a, b in parts]
        mid.stackplot(
            split["t"], split["training"], split["start_up"], lost, step="post",
            labels=["training", "starting (fragment start → first step)",
                    "held otherwise, or no task"],
            colors=["tab:green", "tab:orange", "lightgray"],
        )  # fmt: skip
        mid.set(ylabel="pilot nodes", title="Where the pilots' node-time went")
        mid.yaxis.set_major_locator(MaxNLocator(integer=True))
        mid.legend(loc="upper right", fontsize=8)
        mid.grid(alpha=0.3)
    if have_pilots:
        top.step(
            t,
            [s.pilot_nodes for s in samples],
            "--",
            where="post",
            lw=2.5,
            label="nodes held by pilots",
        )
    if have_status:
        top.step(t, [s.in_use or 0 for s in samples], where="post", label="nodes in use (training)")
        top.step(t, [s.idle or 0 for s in samples], where="post", label="pilot nodes idle")
    top.set(ylabel="nodes", title="Nodes over the run")
    top.yaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
    top.legend(loc="upper right", fontsize=8)
    top.grid(alpha=0.3)
    for name in ("running", "queued", "done"):
        bottom.step(t, [getattr(s, name) for s in samples], where="post", label=f"tasks {name}")
    bottom.set(xlabel="seconds", ylabel="tasks")
    bottom.legend(loc="upper left", fontsize=8)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _flat(summary: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key, value in summary.items():
        if isinstance(value, dict):
            rows += [{"key": f"{key}.{k}", "value": v} for k, v in value.items()]
        else:
            rows.append({"key": key, "value": value})
    return rows


TASK_COLUMNS = [
    "task",
    "app",
    "executor",
    "state",
    "tries",
    "seconds",
    "work",
    "options",
    "samples",
    "world",
    "loss",
    "error",
]
MAX_TASK_ROWS = 500
# More metric keys than this over the tasks (e.g. a sweep of different codes): report.md shows
# them in one "metrics" column (key=value, …) to stay readable; tasks.csv always has a column
# per key.
MAX_METRIC_COLUMNS = 6


def _explained(acc: dict[str, Any]) -> list[str]:
    """The accounting's figures in plain words, one bullet each."""
    p1 = acc.get("p1") or "each task's one-node rate in this run"
    out = [
        "- **util**: the share of the node-seconds the pilots offered that ran a task; 1.0: "
        "no offered node was ever idle.",
        f"- **E_used**: the samples trained, counted as the node-seconds they take at P(1) "
        f"({p1}), over the node-seconds the tasks held; 1.0: every held node trained at a "
        "lone node's rate, with nothing lost to start-ups, rescales, preemptions or poor "
        "scaling.",
        "- **E_avail**: the same over every node-second the pilots offered (E_used × util, "
        "up to the tasks left out below).",
    ]
    cap = acc.get("node_capacity")
    if isinstance(cap, float) and cap < 1:
        out.append(
            f"- The emulated nodes share this machine's cores: a node in use was worth "
            f"{cap:.2f} of a node with a core of its own on average, and both sides of E are "
            "counted at that worth; the emulation's cost is that factor, not the system's."
        )
    if acc.get("unmeasured_node_s"):
        out.append(
            f"- {_cell(acc['unmeasured_node_s'])} node-seconds of tasks never run at one node "
            "(no P(1) to count them by) are left out of E_used and E_avail."
        )
    return [*out, ""]


def _node_split(snapshots: list[dict[str, Any]], started: str) -> dict[str, list[float]] | None:
    """The first BackfillExecutor's node-time over the run, for the timeline (None: no event
    log, or a start time that is not ISO 8601)."""
    from datetime import datetime

    paths = [Path(p).parent for p in (s.get("path") for s in snapshots) if p]
    logs = [p for p in paths if (p / "events.jsonl").is_file()]
    try:
        t0 = datetime.fromisoformat(started).timestamp()
    except ValueError:
        return None
    if not logs:
        return None
    from .executor.analysis import load_run, node_time_series

    events, reports = load_run(logs[0])
    if not events:
        return None
    first, last = float(events[0]["t"]), float(events[-1]["t"])
    times = [first + (last - first) * i / 400 for i in range(401)]
    return {"t": [x - t0 for x in times], **node_time_series(events, reports, times)}


def _node_time_section(status_path: str | None) -> list[str]:
    """Where the pilots' node-seconds went, from the executor's event log beside its
    status file (nothing if there is none)."""
    if not status_path or not (Path(status_path).parent / "events.jsonl").is_file():
        return []
    from .executor.analysis import load_run, node_time

    split = node_time(*load_run(Path(status_path).parent))
    offered = split.get("offered") or 0.0
    if offered <= 0:
        return []
    rows = [
        ("training", "ranks between step reports"),
        ("start_up", "fragment start → first step (process start, checkpoint load)"),
        ("other_held", "held, not training: hand-overs, stops and checkpoints on preemption"),
        ("no_work", "pilot nodes no task held (no work for them, or kept for one to start)"),
    ]
    table = [
        {"node-seconds": k, "s": round(split[k], 1), "share": round(split[k] / offered, 3),
         "what": what}
        for k, what in rows
    ]  # fmt: skip
    return [
        f"Where the {offered:.0f} node-seconds of the pilots went (wall seconds, from the "
        "event log; the node timeline plots the same):",
        "",
        markdown_table(table, ["node-seconds", "s", "share", "what"]),
        "",
    ]


def _status_section(snapshot: dict[str, Any]) -> list[str]:
    out = [
        f"### {snapshot.get('label', '?')} (`{snapshot.get('path', '')}`)",
        "",
        f"solves {snapshot.get('solves')}, last solve {_cell(snapshot.get('last_solve_s'))} s, "
        f"decisions {snapshot.get('decisions')} (median {_cell(snapshot.get('decision_p50_s'))}"
        f" s), preemptions {snapshot.get('preemptions')}, plain tasks {snapshot.get('plain')}",
        "",
    ]
    acc = snapshot.get("accounting") or {}
    if acc:
        out += [
            f"util {_cell(acc.get('util'))}, E_used {_cell(acc.get('E_used'))}, "
            f"E_avail {_cell(acc.get('E_avail'))} (node-seconds offered by pilots "
            f"{_cell(acc.get('offered_node_s'))}, running tasks {_cell(acc.get('used_node_s'))};"
            " samples counted in node-equivalents at each task's one-node rate, averaged over"
            " the run)",
            "",
            *_explained(acc),
        ]
        if acc.get("suspect"):
            out += [f"**Not a result:** {acc['suspect']}.", ""]
        if acc.get("noise"):
            out += [f"**Not an efficiency above 1:** {acc['noise']}.", ""]
    out += _node_time_section(snapshot.get("path"))
    if snapshot.get("pilots"):
        out += [markdown_table(snapshot["pilots"], ["pilot", "nodes", "ends_in_s", "leaving"]), ""]
    if snapshot.get("tasks"):
        cols = ["task", "state", "nodes", "samples", "work", "rate"]
        out += [markdown_table(snapshot["tasks"], cols), ""]
    return out


def write_report(
    directory: str | Path,
    *,
    workflow: str,
    command: str,
    config: str,
    started: str,
    elapsed_s: float,
    run_dirs: list[str],
    summary: dict[str, Any] | None,
    tasks: list[dict[str, Any]],
    samples: list[Sample],
    snapshots: list[dict[str, Any]],
    preemptions: int,
    pilot_ends: dict[str, int] | None = None,
    error: str | None = None,
) -> Path:
    """Write the report files into ``directory`` (created); returns the report.md path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    sample_columns = [f.name for f in fields(Sample)]
    _write_csv(out / "timeline.csv", [asdict(s) for s in samples], sample_columns)
    columns = task_columns(tasks)
    flat = [_flat_metrics(t) for t in tasks]
    _write_csv(out / "tasks.csv", flat, columns)
    (out / "summary.json").write_text(
        json.dumps((summary or {}) | {"preemptions": preemptions}, indent=2, default=str)
    )
    plotted = plot_nodes(samples, out / "nodes.png", _node_split(snapshots, started))

    done = sum(1 for t in tasks if t["state"] in STATE_GROUPS["done"])
    failed = sum(1 for t in tasks if t["state"] in STATE_GROUPS["failed"])
    lines = [
        f"# parsl-bf run: {workflow}",
        "",
        f"- command: `{command}`",
        f"- config: `{config}`",
        f"- started: {started}, elapsed {elapsed_s:.1f} s",
        f"- Parsl run directory: {', '.join(f'`{d}`' for d in run_dirs) or '(none)'}",
        f"- tasks: {len(tasks)} ({done} done, {failed} failed); preemptions: {preemptions}",
        "- pilots: " + (", ".join(f"{n} {why}" for why, n in sorted(pilot_ends.items())) or "none")
        if pilot_ends is not None
        else "- pilots: (the providers keep no record)",
        f"- outcome: {'error: ' + error if error else 'ok'}",
        "",
        "## Summary",
        "",
        markdown_table(_flat(summary), ["key", "value"]) if summary else "(no summary)",
        "",
        f"## Tasks ({len(tasks)})",
        "",
    ]
    if tasks:
        if len(columns) - len(TASK_COLUMNS) > MAX_METRIC_COLUMNS:
            shown = [t | {"metrics": _metrics_text(t.get("metrics") or {})} for t in tasks]
            columns = _before_error(["metrics"])
        else:
            shown = flat
        shown = shown[:MAX_TASK_ROWS]
        lines.append(markdown_table(shown, columns))
        if len(tasks) > len(shown):
            lines.append(f"\n({len(tasks) - len(shown)} more in `tasks.csv`)")
    else:
        lines.append("(no task records)")
    lines.append("")
    if plotted:
        lines += ["## Nodes over time", "", "![nodes over time](nodes.png)", ""]
    if snapshots:
        lines += ["## BackfillExecutor status (last snapshot)", ""]
        for snapshot in snapshots:
            lines += _status_section(snapshot)
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
