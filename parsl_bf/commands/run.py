"""``parsl-bf run WORKFLOW --config CONFIG [--report DIR] [workflow args]``.

Loads the YAML config, imports the workflow file by path and calls its
``main(argv=workflow_args, config=config)`` in this process, which loads the config into Parsl
(``with parsl.load(config):``) and returns a summary dict. Meanwhile :mod:`.progress` watches
the run. At the end: a summary table, a report directory (:mod:`parsl_bf.report`), and as the
last line of stdout one JSON object, the workflow's summary plus ``preemptions`` and
``report``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shlex
import sys
import time
import traceback
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from ..report import task_rows, write_report
from .progress import Progress, pilot_ends, provider_preemptions

__all__ = ["add_parser", "run_workflow"]

EXIT_BAD_INPUT = 2
PROG = "parsl-bf run"


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


def _load(args: argparse.Namespace) -> tuple[Any, Path, ModuleType] | int:
    """The config, the workflow's path and its module; or, on bad input, the exit code (2)."""
    from ..config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except (ConfigError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    path = Path(args.workflow)
    if not path.is_file():
        print(f"{PROG}: error: {path}: no such workflow file", file=sys.stderr)
        return EXIT_BAD_INPUT
    _executables_on_path()
    try:
        module = _import_workflow(path)
    except Exception:
        traceback.print_exc()
        print(f"{PROG}: error: {path}: the workflow failed to import", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not callable(getattr(module, "main", None)):
        print(f"{PROG}: error: {path}: no main(argv=None, config=None)", file=sys.stderr)
        return EXIT_BAD_INPUT
    return config, path, module


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

    loaded = _load(args)
    if isinstance(loaded, int):
        return loaded
    config, path, module = loaded

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
                _cleanup()
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
        print(f"{PROG}: the workflow did not finish ({error}); report in {report}", file=sys.stderr)
        return code or 1
    console.print(_summary_table(path.name, summary, elapsed, report))
    print(json.dumps(summary | {"preemptions": preemptions, "report": str(report)}, default=str))
    sys.stdout.flush()
    return 0


def _cleanup() -> None:
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


def add_parser(sub: Any) -> None:
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
