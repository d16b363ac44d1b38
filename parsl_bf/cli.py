"""The ``parsl-bf`` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from . import config_reference
from .allocation import AllocationInputError, AllocationProblem, SolverUnavailableError, allocate
from .commands import run as run_command
from .commands import status as status_command
from .replay import cli as replay_cli

__all__ = ["main"]

EXIT_BAD_INPUT = 2


def _solve(args: argparse.Namespace) -> int:
    path = Path(args.instance)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise AllocationInputError(str(path), exc.strerror or str(exc)) from None
    except json.JSONDecodeError as exc:
        raise AllocationInputError(str(path), f"not JSON: {exc}") from None
    problem = AllocationProblem.from_dict(data)
    result = allocate(problem, solver=args.solver, time_limit=args.time_limit)
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
