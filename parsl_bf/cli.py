"""The ``parsl-bf`` command."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from . import config_reference
from .allocation import AllocationInputError, AllocationProblem, SolverUnavailableError, allocate
from .allocation.errors import json_line
from .allocation.spec import MAX_EXACT_WORK
from .commands import run as run_command
from .commands import status as status_command
from .replay import cli as replay_cli

__all__ = ["main"]

EXIT_BAD_INPUT = 2


#: The largest instance file ``solve`` reads, in bytes.
MAX_INSTANCE_BYTES = 64 << 20
#: The longest ``--time-limit``, in seconds (a day).
MAX_TIME_LIMIT_S = 86400.0


def _solve(args: argparse.Namespace) -> int:
    path = Path(args.instance)
    limit = args.time_limit
    if not (math.isfinite(limit) and 0 <= limit <= MAX_TIME_LIMIT_S):
        raise AllocationInputError(
            "--time-limit", f"expected 0 to {MAX_TIME_LIMIT_S:g} seconds, got {limit}"
        )
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_INSTANCE_BYTES + 1)
    except OSError as exc:
        raise AllocationInputError(str(path), exc.strerror or str(exc)) from None
    if len(raw) > MAX_INSTANCE_BYTES:
        raise AllocationInputError(
            str(path), f"larger than {MAX_INSTANCE_BYTES} bytes: not an allocation instance"
        )
    try:
        text = raw.decode("utf-8")
        data = json.loads(text)
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise AllocationInputError(f"{path}:{line}", "not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise AllocationInputError(f"{path}:{exc.lineno}", f"not JSON: {exc.msg}") from None
    except RecursionError:
        raise AllocationInputError(str(path), "not JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise AllocationInputError(str(path), f"not JSON: {exc}") from None

    def located(exc: AllocationInputError) -> AllocationInputError:
        field = exc.field
        by_id = re.match(r"tasks\[([^\]]*)\](.*)$", field)  # the solvers name a task by its id
        if by_id and isinstance(data, dict) and isinstance(data.get("tasks"), list):
            ids = [str(t.get("id")) if isinstance(t, dict) else None for t in data["tasks"]]
            if not by_id.group(1).isdigit() and by_id.group(1) in ids:
                field = f"tasks[{ids.index(by_id.group(1))}]{by_id.group(2)}"
        if not field:  # the instance as a whole
            return AllocationInputError(str(path), exc.message)
        return AllocationInputError(f"{path}:{json_line(text, field)} {field}", exc.message)

    try:
        problem = AllocationProblem.from_dict(data)
        if args.solver == "exact" and problem.exact_work > MAX_EXACT_WORK:
            raise AllocationInputError(
                "",
                f"too large for the exact program ({problem.exact_work:.2g} cell updates, the "
                f"limit is {MAX_EXACT_WORK:.2g}): use --solver milp",
            )
        result = allocate(problem, solver=args.solver, time_limit=limit)
    except AllocationInputError as exc:
        raise located(exc) from None
    print(json.dumps(result.to_json_dict()))
    return 0


def _validate(args: argparse.Namespace) -> int:
    from .allocation import AllocatorSettings
    from .config import ConfigError, validate_config

    try:
        config = validate_config(args.config)
    except (ConfigError, OSError) as exc:
        print(f"parsl-bf validate: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    labels = ", ".join(
        f"{e.label} ({type(e).__name__} on {type(e.provider).__name__})"
        if hasattr(e, "provider")
        else e.label
        for e in config.executors
    )
    summary = f"{args.config}: ok: executors {labels}"
    for e in config.executors:  # the allocation policy of each executor that has one
        if isinstance(getattr(e, "allocator", None), AllocatorSettings):
            summary += f"; {e.label} allocator {e.allocator.model_dump(mode='json')}"
    print(summary)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parsl-bf", description="Elastic DNN training on a batch scheduler's idle nodes."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    solve = sub.add_parser(
        "solve",
        help="decide node counts for one allocation event",
        description="Read an allocation instance (JSON) and print the plan as one JSON object.",
    )
    solve.add_argument("instance", help="instance JSON: tfwd, free_nodes, objective, tasks")
    solve.add_argument(
        "--solver",
        choices=["milp", "exact"],
        default="milp",
        help="Pyomo+GLPK MILP (default) or the exact dynamic program",
    )
    solve.add_argument(
        "--time-limit",
        type=float,
        default=10.0,
        metavar="S",
        help="solver time limit in seconds (default 10)",
    )
    solve.set_defaults(func=_solve)
    replay_cli.add_parser(sub)
    validate = sub.add_parser(
        "validate",
        help="check a YAML config",
        description="Check a parsl_bf YAML config: every class, key, type and variable.",
    )
    validate.add_argument("config", help="YAML config file")
    validate.set_defaults(func=_validate)
    run_command.add_parser(sub)
    status_command.add_parser(sub)
    config_reference.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    # `run` hands the arguments it does not know to the workflow.
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "run":
        args.workflow_args = rest[1:] if rest[:1] == ["--"] else rest
    try:
        return args.func(args)
    except AllocationInputError as exc:
        print(f"parsl-bf {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SolverUnavailableError as exc:
        print(f"parsl-bf {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
