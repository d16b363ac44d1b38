"""``parsl-bf run WORKFLOW --config CONFIG [workflow args]`` and ``parsl-bf status [RUN_DIR]``.

``run`` loads the YAML config, imports the workflow file by path and calls its
``main(argv=workflow_args, config=config)`` in this process, which loads the config into Parsl
(``with parsl.load(config):``) and returns a summary dict. Meanwhile a thread looks at the run
every ~2 s: the DataFlowKernel's task counts, the providers' pilots and, with a
BackfillExecutor, its status snapshots (nodes in use and idle, samples/s, preemptions); shown
live on a terminal, as log lines otherwise. At the end: a summary table, a report directory
(:mod:`parsl_bf.report`), and as the last line of stdout one JSON object, the workflow's summary
plus ``preemptions`` and ``report``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shlex
import sys
import threading
import time
import traceback
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from .report import Sample, group_counts, task_rows, write_report

__all__ = ["add_parsers", "run_workflow", "show_status"]

EXIT_BAD_INPUT = 2
PERIOD_S = 2.0


# --- the progress thread ---------------------------------------------------------------------


def _is_backfill(executor: Any) -> bool:
    return any(c.__name__ == "BackfillExecutor" for c in type(executor).__mro__)


def _pilots(config: Any) -> list[Any]:
    """Every pilot the config's providers record (those with a ``pilots`` dict)."""
    found = []
    for executor in config.executors:
        pilots = getattr(getattr(executor, "provider", None), "pilots", None)
        if isinstance(pilots, dict):
            with contextlib.suppress(RuntimeError):  # changed while we copied: next time
                found += list(pilots.values())
    return found


def provider_preemptions(config: Any) -> int:
    return sum(1 for p in _pilots(config) if getattr(p, "reason", "") == "preempted")


def pilot_ends(config: Any) -> dict[str, int] | None:
    """The providers' pilots by how they ended ("preempted", "walltime", ...) or their state."""
    if not any(
        isinstance(getattr(getattr(e, "provider", None), "pilots", None), dict)
        for e in config.executors
    ):
        return None
    counts: dict[str, int] = {}
    for p in _pilots(config):
        why = getattr(p, "reason", "") or getattr(getattr(p, "state", None), "name", "?").lower()
        counts[why] = counts.get(why, 0) + 1
    return counts


def _snapshots(run_dir: str | None) -> list[dict[str, Any]]:
    if run_dir is None:
        return []
    from .executor.events import read_status

    try:
        return read_status(run_dir)
    except (OSError, ValueError):  # being rewritten (atomically, but the glob may race)
        return []


class Progress(threading.Thread):
    """Samples the run every ``period`` seconds; shows it live or as log lines."""

    def __init__(self, config: Any, live: bool, period: float = PERIOD_S) -> None:
        super().__init__(name="parsl-bf-progress", daemon=True)
        self.config, self.live, self.period = config, live, period
        self.backfill = sum(1 for e in config.executors if _is_backfill(e))
        self._status_paths: list[str] = []  # found once by read_status, then read directly
        self._status_run: str | None = None
        self.start_time = time.monotonic()
        self.dfks: list[Any] = []
        self.samples: list[Sample] = []
        self._stop_event = threading.Event()
        self.display: Any = None  # a rich Live, when live
        self._last_line = ""
        self._last_print = 0.0

    # The DFK appears once the workflow has loaded the config: look for it often until then.
    def _find_dfk(self) -> Any:
        import parsl

        try:
            dfk = parsl.dfk()
        except Exception:  # none loaded (yet, or any more)
            return None
        if not any(d is dfk for d in self.dfks):
            self.dfks.append(dfk)
        return dfk

    @property
    def run_dirs(self) -> list[str]:
        return [d.run_dir for d in self.dfks]

    def snapshots(self) -> list[dict[str, Any]]:
        """The BackfillExecutors' status snapshots of the current run."""
        if not self.backfill or not self.dfks:
            return []
        run_dir = self.dfks[-1].run_dir
        if run_dir != self._status_run or len(self._status_paths) < self.backfill:
            found = _snapshots(run_dir)
            self._status_run, self._status_paths = run_dir, [f["path"] for f in found]
            return found
        out = []
        for path in self._status_paths:
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(Path(path).read_text()) | {"path": path})
        return out

    def sample(self) -> Sample:
        s = Sample(t=round(time.monotonic() - self.start_time, 1))
        for dfk in self.dfks:
            with dfk.task_state_counts_lock:
                counts = dict(dfk.task_state_counts)
            for group, n in group_counts(counts).items():
                setattr(s, group, getattr(s, group) + n)
        from parsl.jobs.states import JobState

        running = [p for p in _pilots(self.config) if p.state is JobState.RUNNING]
        s.pilots, s.pilot_nodes = len(running), sum(len(p.nodes) for p in running)
        snapshots = self.snapshots()
        if snapshots:
            held = sum(
                len(p.get("nodes", [])) for snap in snapshots for p in snap.get("pilots", [])
            )
            tasks = [t for snap in snapshots for t in snap.get("tasks", [])]
            s.in_use = sum(t.get("nodes") or 0 for t in tasks)
            s.idle = max(0, held - s.in_use)
            s.rate = round(sum(t.get("rate") or 0.0 for t in tasks), 1)
            s.preemptions = sum(snap.get("preemptions") or 0 for snap in snapshots)
        return s

    def run(self) -> None:
        while not self._stop_event.is_set():
            dfk = self._find_dfk()
            if self.dfks:
                self._record()
            self._stop_event.wait(self.period if dfk is not None else 0.1)

    def _record(self) -> None:
        try:
            s = self.sample()
        except Exception:  # never let a look at the run break it
            return
        self.samples.append(s)
        self._show(s)

    def _show(self, s: Sample) -> None:
        if self.live:
            if self.display is not None:
                self.display.update(_live_view(s), refresh=True)
            return
        line = _line(s)
        now = time.monotonic()
        if line != self._last_line or now - self._last_print >= 30:
            print(f"[parsl-bf {s.t:6.0f}s] {line}", flush=True)
            self._last_line, self._last_print = line, now

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=10)
        self._find_dfk()
        if self.dfks:
            self._record()  # the final counts


def _line(s: Sample) -> str:
    parts = [f"tasks {s.done} done, {s.running} running, {s.queued} queued, {s.failed} failed"]
    if s.pilots or s.pilot_nodes:
        parts.append(f"pilots {s.pilots} ({s.pilot_nodes} nodes)")
    if s.in_use is not None:
        parts.append(f"nodes {s.in_use} in use, {s.idle} idle, {s.rate} samples/s")
    if s.preemptions:
        parts.append(f"preemptions {s.preemptions}")
    return " | ".join(parts)


def _live_view(s: Sample) -> Any:
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_row("[bold]elapsed[/]", f"{s.t:.0f} s")
    table.add_row(
        "[bold]tasks[/]",
        f"[green]{s.done} done[/]  [cyan]{s.running} running[/]  {s.queued} queued  "
        f"[red]{s.failed} failed[/]",
    )
    table.add_row("[bold]pilots[/]", f"{s.pilots} running, {s.pilot_nodes} nodes")
    if s.in_use is not None:
        table.add_row("[bold]nodes[/]", f"{s.in_use} in use, {s.idle} idle; {s.rate} samples/s")
        table.add_row("[bold]preemptions[/]", str(s.preemptions))
    return table


# --- parsl-bf run ----------------------------------------------------------------------------


def _import_workflow(path: Path) -> ModuleType:
    """The workflow module, imported as ``python path`` would see it (its directory first on
    the path; also on PYTHONPATH, for workers unpickling apps defined there)."""
    directory = str(path.parent.resolve())
    if directory not in sys.path:
        sys.path.insert(0, directory)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (directory, os.environ.get("PYTHONPATH")) if p
    )
    # Its own name, so that workers import the apps it defines; unless that name is taken.
    name = path.stem if path.stem not in sys.modules else f"parsl_bf_workflow_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _executables_on_path() -> None:
    """HTEX starts ``interchange.py`` and ``process_worker_pool.py`` from PATH: make it find
    this environment's, as when it is activated."""
    here = str(Path(sys.executable).parent)
    if here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(p for p in (here, os.environ.get("PATH")) if p)


def _summary_table(workflow: str, summary: dict[str, Any], elapsed: float, report: Path) -> Any:
    from rich.table import Table

    table = Table(title=f"parsl-bf run: {workflow}", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    rows = [("elapsed", f"{elapsed:.1f} s")]
    for key, value in summary.items():
        if key == "report":
            continue  # the report directory: below
        if isinstance(value, dict):
            rows += [(f"{key}.{k}", v) for k, v in value.items()]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            rows.append((key, f"{len(value)} entries"))
        else:
            rows.append((key, value))
    rows.append(("report", str(report / "report.md")))
    for key, value in rows:
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    return table


def run_workflow(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from .config import ConfigError, load_config

    prog = "parsl-bf run"
    try:
        config = load_config(args.config)
    except (ConfigError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    path = Path(args.workflow)
    if not path.is_file():
        print(f"{prog}: error: {path}: no such workflow file", file=sys.stderr)
        return EXIT_BAD_INPUT
    _executables_on_path()
    try:
        module = _import_workflow(path)
    except Exception:
        traceback.print_exc()
        print(f"{prog}: error: {path}: the workflow failed to import", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not callable(getattr(module, "main", None)):
        print(f"{prog}: error: {path}: no main(argv=None, config=None)", file=sys.stderr)
        return EXIT_BAD_INPUT

    config.garbage_collect = False  # keep every task record, for the per-task report table
    console = Console()
    live = console.is_terminal
    progress = Progress(config, live)
    started = datetime.now()
    start = time.monotonic()
    summary: dict[str, Any] | None = None
    error: str | None = None
    code = 0
    display = (
        Live(console=console, auto_refresh=False, transient=True)
        if live
        else contextlib.nullcontext()
    )
    with display as shown:
        progress.display = shown
        progress.start()
        try:
            result = module.main(argv=list(args.workflow_args), config=config)
            summary = dict(result) if isinstance(result, dict) else {"result": result}
        except SystemExit as exc:  # the workflow's argparse, or its own exit
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            error = f"exit {code}"
        except KeyboardInterrupt:
            code, error = 130, "interrupted"
        except Exception as exc:
            traceback.print_exc()
            code, error = 1, f"{type(exc).__name__}: {exc}"
        finally:
            progress.stop()
            with contextlib.suppress(Exception):  # a DFK the workflow left loaded
                _cleanup(progress)
    elapsed = time.monotonic() - start
    if summary is None and not progress.dfks:  # e.g. the workflow's --help or a usage error
        return code

    snapshots = progress.snapshots()
    if snapshots:
        preemptions = sum(s.get("preemptions") or 0 for s in snapshots)
    else:
        preemptions = provider_preemptions(config)
    records = [rec for dfk in progress.dfks for rec in dfk.tasks.values()]
    report = _report_dir(args.report, summary, path)
    write_report(
        report,
        workflow=str(path),
        command=shlex.join(
            ["parsl-bf", "run", str(path), "--config", str(args.config), *args.workflow_args]
        ),
        config=str(args.config),
        started=started.isoformat(timespec="seconds"),
        elapsed_s=elapsed,
        run_dirs=progress.run_dirs,
        summary=summary,
        tasks=task_rows(records),
        samples=progress.samples,
        snapshots=snapshots,
        preemptions=preemptions,
        pilot_ends=pilot_ends(config),
        error=error,
    )
    if summary is None:
        print(f"{prog}: the workflow did not finish ({error}); report in {report}", file=sys.stderr)
        return code or 1
    console.print(_summary_table(path.name, summary, elapsed, report))
    print(json.dumps(summary | {"preemptions": preemptions, "report": str(report)}, default=str))
    sys.stdout.flush()
    return 0


def _cleanup(progress: Progress) -> None:
    import parsl

    dfk = parsl.dfk()  # raises when the workflow cleaned up, as it should
    if not dfk.cleanup_called:
        dfk.cleanup()


def _report_dir(option: str | None, summary: dict[str, Any] | None, workflow: Path) -> Path:
    """``--report``, else the workflow's own output directory (its summary's ``report``), else
    ``runs/<workflow>-<timestamp>``."""
    if option:
        return Path(option)
    named = (summary or {}).get("report")
    if isinstance(named, str) and Path(named).is_dir():
        return Path(named)
    return Path("runs") / f"{workflow.stem}-{datetime.now():%Y%m%d-%H%M%S}"


# --- parsl-bf status -------------------------------------------------------------------------


def _latest_run(snapshots: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The snapshots of the newest run (one per executor: ``<run>/<label>/status.json``)."""
    newest = Path(snapshots[0]["path"]).parent.parent
    return [s for s in snapshots if Path(s["path"]).parent.parent == newest]


def _status_tables(snapshot: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    updated = snapshot.get("updated")
    age = f"{time.time() - updated:.0f} s ago" if isinstance(updated, int | float) else "?"
    head = Table(title=f"{snapshot.get('label', '?')}: {snapshot['path']}", show_header=False)
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
    for key, value in rows:
        head.add_row(key, str(value))
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
    tables = [head, pilots]
    if snapshot.get("blocks"):
        tables.append(blocks)
    if "tasks" not in snapshot:  # a stock executor: Parsl tracks its tasks
        return tables
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
    return [*tables, tasks]


def show_status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .executor.events import read_status

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
        for table in _status_tables(snapshot):
            console.print(table)
    return 0


# --- the subcommands -------------------------------------------------------------------------


def add_parsers(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="run a workflow with live progress and a report",
        usage="parsl-bf run WORKFLOW --config CONFIG [--report DIR] [WORKFLOW ARGS ...]",
        description=(
            "Load CONFIG, call WORKFLOW's main(argv, config) in this process with the arguments "
            "that follow, show progress, write a report directory; the last line of output is "
            "the workflow's summary as JSON, with preemptions and the report directory. "
            "Arguments it does not know go to the workflow (after `--`, all of them)."
        ),
        epilog="e.g. parsl-bf run workflows/hpo_sweep.py --config configs/local.yaml --trials 8",
    )
    run.add_argument("workflow", help="workflow file (a Python file with main(argv, config))")
    run.add_argument("--config", required=True, help="YAML config file")
    run.add_argument(
        "--report",
        metavar="DIR",
        help="report directory (default: the workflow's output directory if its summary names "
        "one as 'report', else runs/<workflow>-<timestamp>)",
    )
    run.set_defaults(func=run_workflow, workflow_args=[])
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
