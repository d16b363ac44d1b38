"""``parsl-bf replay``: replay a trace with a policy and write the report."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

from pydantic import ValidationError

from ..allocation import DEFAULT_SETTINGS, AllocatorSettings, Objective
from ..allocation.spec import MAX_NODES, MAX_SECONDS, MAX_TASKS
from ..inputs.errors import ReplayInputError
from ..inputs.trace import load_trace
from .holes import HoleForecast
from .jobsets import default_data_dir, load_job_set
from .policies import POLICIES
from .report import summary_table, write_report
from .simulator import ORIGINAL_ACCOUNTING, ReplayConfig, replay
from .swf import load_swf

__all__ = ["add_parser", "parse_duration"]

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """Seconds from ``3600``, ``90m``, ``48h`` or ``2d`` (at most ``MAX_SECONDS``)."""
    m = re.fullmatch(r"\s*(\d{1,12}(?:\.\d{1,9})?)\s*([smhd]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 3600, 90m, 48h)")
    seconds = int(float(m.group(1)) * _UNITS[m.group(2)])
    if seconds > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is longer than {MAX_SECONDS} s (ten years)")
    return seconds


def _accuracy(text: str) -> tuple[float, float]:
    """``0.5:1`` → (0.5, 1.0); ``1`` → (1.0, 1.0): walltime accuracies in (0, 1]."""
    parts = text.split(":")
    try:
        low, high = float(parts[0]), float(parts[-1])
    except ValueError:
        low = high = float("nan")
    if len(parts) > 2 or not 0 < low <= high <= 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected LOW[:HIGH] with 0 < LOW <= HIGH <= 1 (e.g. 1, 0.5:1)"
        )
    return low, high


def seconds_or_none(text: str) -> float | None:
    """``1.5`` → 1.5; ``none`` → None (the original replayer's restart): seconds >= 0."""
    if text == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds >= 0, or none")
    return value


def _flag_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the numeric flags, if anything."""
    if not 0 <= args.announced <= 1:
        return f"--announced: expected 0 to 1, got {args.announced}"
    bounds = [
        ("--swf-nodes", args.swf_nodes, 1, MAX_NODES),
        ("--procs-per-node", args.procs_per_node, 1, 10**6),
        ("--max-jobs", args.max_jobs, 1, MAX_TASKS),
        ("--nodes", args.nodes, 1, MAX_NODES),
        ("--node-offset", args.node_offset, 0, MAX_NODES),
    ]
    for flag, value, low, high in bounds:
        if value is not None and not low <= value <= high:
            return f"{flag}: expected {low} to {high}, got {value}"
    return None


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay an idle-node trace with an allocation policy",
        description="Replay elastic training jobs on the idle nodes of a recorded trace, with "
        "the accounting of the original BFTrainer replayer, and write summary.json, steps.csv "
        "and plots. Ends with the summary as one JSON line.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--trace", type=Path, help="trace directory (default: the dev trace)")
    src.add_argument("--swf", type=Path, help="Standard Workload Format log instead of a trace")
    p.add_argument("--swf-nodes", type=int, help="machine nodes for --swf (default: header)")
    p.add_argument("--procs-per-node", type=int, default=1, help="SWF processors per node")
    p.add_argument(
        "--jobs",
        default="hps-shufflenet-10J",
        help="job-set file, or a set name under the data's jobs/ (default %(default)s)",
    )
    default = DEFAULT_SETTINGS  # the executor's defaults, defined there once
    p.add_argument("--policy", choices=POLICIES, default=default.policy)
    p.add_argument(
        "--objective",
        choices=[o.value for o in Objective],
        default=default.objective.value,
        help="what the allocator maximises (default %(default)s)",
    )
    p.add_argument(
        "--tfwd",
        default=f"{default.tfwd:g}" if default.tfwd != "auto" else "auto",
        help="look-ahead seconds, or 'auto': the median hole length (default %(default)s)",
    )
    p.add_argument("--time-limit", type=float, default=default.time_limit, help="solver limit, s")
    p.add_argument("--max-jobs", type=int, default=10, help="concurrent jobs (default 10)")
    p.add_argument(
        "--charge-starts",
        action="store_true",
        help="charge a start from zero nodes R_up·P(n), as a real fragment's start-up "
        "(the original replayer starts tasks for free)",
    )
    p.add_argument(
        "--preemption-shrink-s",
        type=seconds_or_none,
        default=ReplayConfig.preemption_shrink_s,
        metavar="S",
        help="what a preemption costs a task whose min_nodes stay, in seconds of its training "
        "(S·P(c)): the preempted ranks leave in place and the others train on, as in the "
        "executor (default %(default)s; none: every preemption restarts its task)",
    )
    p.add_argument(
        "--rescale-in-place-s",
        type=seconds_or_none,
        default=ReplayConfig.rescale_in_place_s,
        metavar="S",
        help="what a planned rescale done in place costs a running task, in seconds of its "
        "training (S·P(c)): a shrink that keeps nodes, and a grow, which first waits for "
        "nodes another task gives back at the same event, as in the executor (default "
        "%(default)s; none: every planned rescale costs the job's R_up or R_down)",
    )
    p.add_argument(
        "--original-accounting",
        action="store_true",
        help="find completions and admit jobs at the trace's events only, never cap a "
        "task's gain at its remaining work, restart a task at every preemption and charge its "
        "rescale apart from it, and charge every planned rescale R_up or R_down, as the "
        "original replayer (default: a completion and a "
        "submission into a free slot are events of their own, a preempted task whose "
        "min_nodes stay shrinks in place, one that restarts does so once, and planned "
        "rescales are done in place where the executor does them so; docs/replay.md)",
    )
    p.add_argument(
        "--hole-plan",
        metavar="LOW[:HIGH]",
        type=_accuracy,
        help="each hole ends when the scheduler's plan says (as squeue --start does), with "
        "walltime accuracy (runtime / walltime) drawn from [LOW, HIGH]; 1 is exact walltimes "
        "(default: the paper's single T_fwd, every node alike)",
    )
    p.add_argument(
        "--announced",
        type=float,
        default=1.0,
        help="with --hole-plan: the fraction of holes the plan gives an end (default 1)",
    )
    p.add_argument(
        "--no-bound",
        action="store_true",
        help="leave out the clairvoyant E_avail bound (its LPs take minutes on thousands of "
        "nodes; summary.json then has E_avail_bound null)",
    )
    p.add_argument("--nodes", type=int, help="use the first N nodes (by col_index)")
    p.add_argument("--node-offset", type=int, default=0, help="skip the first K nodes")
    p.add_argument("--start", type=parse_duration, default=0, help="window start (48h, 90m, s)")
    p.add_argument("--end", type=parse_duration, help="window end (default: trace end)")
    p.add_argument("--out", type=Path, help="report directory (default runs/replay-<time>)")
    p.set_defaults(func=run)


def _jobs_path(spec: str) -> Path:
    path = Path(spec)
    if path.exists() or path.suffix in (".json", ".csv"):
        return path
    return default_data_dir() / "jobs" / f"{spec}.json"


#: What a user is told during each stage after the events (``replay(stage=...)``).
STAGES = {"bound": "E_avail bound: solving its LPs with GLPK (--no-bound leaves it out)"}


def _progress(end_s: int, start_s: int):
    """A rich progress bar on a terminal, else a log line every 10% of simulated time; and a
    line when the bound's LPs begin, which can take minutes after the last event."""
    total = max(1, end_s - start_s)
    began = time.perf_counter()
    if sys.stderr.isatty():
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(
            TextColumn("replay"),
            BarColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            transient=True,
        )
        task = bar.add_task("", total=total)
        bar.start()

        def update(t: int, events: int) -> None:
            rate = events / max(1e-9, time.perf_counter() - began)
            bar.update(
                task,
                completed=t - start_s,
                description=f"{(t - start_s) / 3600:7.1f} h simulated, {rate:6.0f} events/s",
            )

        def stage(name: str) -> None:
            bar.update(task, completed=total, description=STAGES.get(name, name))

        return update, stage, bar.stop
    mark = [0.0]

    def log(t: int, events: int) -> None:
        done = (t - start_s) / total
        if done >= mark[0] + 0.1:
            mark[0] = done
            print(
                f"replay: {100 * done:3.0f}% ({(t - start_s) / 3600:.1f} h simulated, "
                f"{events} events, {time.perf_counter() - began:.0f} s)",
                file=sys.stderr,
            )

    def stage_line(name: str) -> None:
        print(f"replay: {STAGES.get(name, name)}", file=sys.stderr)

    return log, stage_line, lambda: None


def run(args: argparse.Namespace) -> int:
    if message := _flag_error(args):
        print(f"parsl-bf replay: error: {message}", file=sys.stderr)
        return 2
    try:
        if args.swf:
            trace, stats = load_swf(args.swf, args.swf_nodes, args.procs_per_node)
            source = {
                "swf": str(args.swf),
                "swf_jobs": stats.jobs,
                "swf_skipped": stats.skipped,
                "swf_squeezed": stats.squeezed,
            }
        else:
            trace_dir = args.trace or default_data_dir() / "trace"
            trace = load_trace(trace_dir, args.nodes, args.node_offset)
            source = {"trace": str(trace_dir)}
        jobs = load_job_set(_jobs_path(args.jobs))
    except (OSError, ReplayInputError) as exc:
        hint = ""
        if isinstance(exc, FileNotFoundError) and not default_data_dir().exists():
            hint = (
                f" (the default data directory {default_data_dir()} does not exist: "
                "set PARSL_BF_DATA, or give --trace and --jobs)"
            )
        print(f"parsl-bf replay: error: {exc}{hint}", file=sys.stderr)
        return 2
    end = trace.end_s if args.end is None else min(args.end, trace.end_s)
    if end <= args.start:
        print(
            f"parsl-bf replay: error: empty window: start {args.start} s, end {end} s "
            f"(the trace lasts {trace.end_s} s)",
            file=sys.stderr,
        )
        return 2
    # The same policy object as the BackfillExecutor's ``allocator``; ``auto`` resolves to the
    # median hole length of the replayed nodes, as the executor's to its pilots' walltimes.
    try:
        policy = AllocatorSettings(
            policy=args.policy, objective=args.objective, tfwd=args.tfwd, time_limit=args.time_limit
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        flag = "--" + str(err["loc"][0]).replace("_", "-")
        print(
            f"parsl-bf replay: error: {flag}: {err['msg'].removeprefix('Value error, ')}",
            file=sys.stderr,
        )
        return 2
    # The holes are the replayed nodes' idle periods, as the executor's are its pilots'.
    holes = trace.hole_lengths(args.start, end) if policy.tfwd == "auto" else ()
    if policy.tfwd == "auto" and not len(holes):
        where = args.swf or args.trace or default_data_dir() / "trace"
        print(
            f"parsl-bf replay: error: {where}: no complete hole in the window: give T_fwd "
            "explicitly (--tfwd)",
            file=sys.stderr,
        )
        return 2
    tfwd = policy.lookahead(holes)
    if policy.tfwd == "auto":
        print(f"T_fwd = {tfwd:.0f} s (median hole length of the replayed nodes)", file=sys.stderr)
    accounting = ORIGINAL_ACCOUNTING if args.original_accounting else {}
    config = ReplayConfig(
        tfwd=tfwd,
        objective=policy.objective,
        max_jobs=args.max_jobs,
        start_s=args.start,
        end_s=end,
        charge_starts=args.charge_starts,
        bound_buckets=0 if args.no_bound else ReplayConfig.bound_buckets,
        holes=HoleForecast(*args.hole_plan, args.announced) if args.hole_plan else None,
        **(
            {
                "preemption_shrink_s": args.preemption_shrink_s,
                "rescale_in_place_s": args.rescale_in_place_s,
            }
            | accounting
        ),
    )
    update, stage, finish = _progress(end, args.start)
    began = time.perf_counter()
    try:
        result = replay(trace, jobs, policy, config, update, stage)
    finally:
        finish()
    out = args.out or Path("runs") / time.strftime("replay-%Y%m%d-%H%M%S")
    meta = {
        "policy": args.policy,
        "objective": args.objective,
        "tfwd": tfwd,
        "nodes": len(trace.nodes),
        "node_offset": args.node_offset,
        "jobs": str(args.jobs),
        "max_jobs": args.max_jobs,
        "charge_starts": args.charge_starts,
        "preemption_shrink_s": config.preemption_shrink_s,
        "rescale_in_place_s": config.rescale_in_place_s,
        "accounting": "original" if args.original_accounting else "executor",
        "hole_ends": config.holes.describe() if config.holes else "tfwd",
        "start_s": args.start,
        "end_s": end,
        "wall_s": round(time.perf_counter() - began, 2),
        "report": str(out),
        **source,
    }
    write_report(result, out, meta)
    print(summary_table(result.summary))
    print(f"report: {out}")
    print(json.dumps({**result.summary, **meta}))
    return 0
