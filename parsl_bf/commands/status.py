"""``parsl-bf status [RUN_DIR]``: the latest executor status snapshots under a Parsl run
directory (``<run>/<label>/status.json``, written by a BackfillExecutor or by a
BackfillErrorHandler), as tables: pilots, blocks, preemptions and a BackfillExecutor's tasks."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "show_status"]


def _latest_run(snapshots: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The snapshots of the newest run (one per executor: ``<run>/<label>/status.json``)."""
    newest = Path(snapshots[0]["path"]).parent.parent
    return [s for s in snapshots if Path(s["path"]).parent.parent == newest]


def _head_table(snapshot: dict[str, Any]) -> Any:
    from rich.table import Table

    updated = snapshot.get("updated")
    age = f"{time.time() - updated:.0f} s ago" if isinstance(updated, int | float) else "?"
    head = Table(title=str(snapshot.get("label", "?")), show_header=False)
    head.add_column("key", style="bold")
    head.add_column("value")
    last = snapshot.get("last_solve_s")
    p50 = snapshot.get("decision_p50_s")
    rows: list[tuple[str, Any]] = [("updated", age)]
    if "solves" in snapshot:  # a BackfillExecutor's decisions
        rows += [
            ("solves", snapshot.get("solves")),
            ("last solve", "-" if last is None else f"{last:.3f} s"),
            ("decisions", snapshot.get("decisions")),
            ("decision p50", "-" if p50 is None else f"{p50:.3f} s"),
        ]
    else:
        rows.append(("executor", snapshot.get("kind", "?")))
    rows.append(("preemptions", snapshot.get("preemptions")))
    if "plain" in snapshot:
        rows.append(("plain tasks", " ".join(f"{k} {v}" for k, v in snapshot["plain"].items())))
    if "failed_blocks" in snapshot:
        rows.append(("failed blocks", snapshot["failed_blocks"]))
    if snapshot.get("backoff_s_left"):  # the error handler holds new pilots after failures
        rows.append(("next pilot in", f"{snapshot['backoff_s_left']} s (back-off)"))
    for key, value in rows:
        head.add_row(key, str(value))
    return head


def _pilots_table(snapshot: dict[str, Any]) -> Any:
    from rich.table import Table

    pilots = Table(title="pilots")
    for column in ("pilot", "nodes", "ends in", "leaving"):
        pilots.add_column(column)
    for p in snapshot.get("pilots") or []:
        ends = p.get("ends_in_s")
        pilots.add_row(
            str(p.get("pilot")),
            ",".join(p.get("nodes") or []) or "-",
            "-" if ends is None else f"{ends} s",
            "yes" if p.get("leaving") else "",
        )
    return pilots


def _blocks_table(snapshot: dict[str, Any]) -> Any:
    from rich.table import Table

    blocks = Table(title="blocks")
    for column in ("block", "job", "state", "outcome", "why"):
        blocks.add_column(column)
    for b in snapshot.get("blocks") or []:
        blocks.add_row(
            str(b.get("block")),
            str(b.get("job") or "-"),
            str(b.get("state")),
            str(b.get("outcome")),
            str(b.get("message") or b.get("reason") or ""),
        )
    return blocks


def _tasks_table(snapshot: dict[str, Any]) -> Any:
    from rich.table import Table

    tasks = Table(title="tasks")
    for column in ("task", "state", "nodes", "samples", "work", "samples/s", "metrics"):
        tasks.add_column(
            column, justify="left" if column in ("task", "state", "metrics") else "right"
        )
    for t in snapshot.get("tasks") or []:
        rate = t.get("rate")
        tasks.add_row(
            str(t.get("task")),
            str(t.get("state")),
            str(t.get("nodes")),
            str(t.get("samples")),
            str(t.get("work")),
            "-" if rate is None else f"{rate:.1f}",
            ", ".join(f"{k}={v:.4g}" for k, v in (t.get("metrics") or {}).items()),
        )
    return tasks


def _status_tables(snapshot: dict[str, Any]) -> list[Any]:
    tables = [_head_table(snapshot), _pilots_table(snapshot)]
    if snapshot.get("blocks"):
        tables.append(_blocks_table(snapshot))
    if "tasks" in snapshot:  # a BackfillExecutor's; of a stock executor, Parsl tracks the tasks
        tables.append(_tasks_table(snapshot))
    return tables


def show_status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..executor.events import read_status

    try:
        snapshots = read_status(args.run_dir)
    except (OSError, ValueError) as exc:
        print(f"parsl-bf status: error: {exc}", file=sys.stderr)
        return 1
    if not snapshots:
        print(
            f"no executor status found under {args.run_dir} (written by a BackfillExecutor, or "
            "by an executor whose block_error_handler is a BackfillErrorHandler)"
        )
        return 1
    console = Console()
    for snapshot in _latest_run(snapshots):
        # The path on a line of its own, never wrapped: it is what a user copies.
        label = snapshot.get("label", "?")
        console.print(f"{label}: {snapshot['path']}", soft_wrap=True, markup=False, highlight=False)
        for table in _status_tables(snapshot):
            console.print(table)
    return 0


def add_parser(sub: Any) -> None:
    status = sub.add_parser(
        "status",
        help="show a run's pilots, blocks, preemptions (and a BackfillExecutor's tasks)",
        description="Print the latest executor status snapshots under RUN_DIR: those of a "
        "BackfillExecutor, or of an executor whose block_error_handler is a "
        "BackfillErrorHandler (e.g. a stock HighThroughputExecutor on backfill pilots).",
    )
    status.add_argument(
        "run_dir", nargs="?", default="runinfo", help="Parsl run directory (default runinfo)"
    )
    status.set_defaults(func=show_status)
