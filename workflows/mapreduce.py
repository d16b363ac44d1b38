"""An ordinary Parsl workflow in the style of Parsl's tutorial: python, bash and join apps
chained by File dependencies, a map, and a tree reduce. Nothing in it knows about backfill.

    python workflows/mapreduce.py --config configs/htex-local-backfill.yaml --out /tmp/mr
    parsl-bf run workflows/mapreduce.py --config configs/htex-local-backfill.yaml

For each of ``--chunks`` chunks: a bash app writes ``--per-chunk`` numbers to a file; a python
app reads that file and writes their squares to another; a python app sums the squares file.
A tree of join apps adds the sums pairwise (each join app returns the future of a python app),
and a bash app concatenates every squares file. The summary (last line, JSON) says whether the
total and the concatenated file are right, with the apps run and, for providers that keep
pilot records, how the pilots ended.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import parsl
from parsl.app.app import bash_app, join_app, python_app
from parsl.data_provider.files import File


@bash_app
def write_numbers(first: int, count: int, outputs: list = ()) -> str:
    return f"seq {first} {first + count - 1} > {outputs[0].filepath}"


@python_app
def square_file(pause: float = 0.0, inputs: list = (), outputs: list = ()) -> int:
    import time

    time.sleep(pause)  # some work, so that tasks are running when pilots are preempted
    with open(inputs[0].filepath) as src:
        numbers = [int(line) for line in src if line.strip()]
    with open(outputs[0].filepath, "w") as dst:
        dst.writelines(f"{n * n}\n" for n in numbers)
    return len(numbers)


@python_app
def sum_file(inputs: list = ()) -> int:
    with open(inputs[0].filepath) as src:
        return sum(int(line) for line in src if line.strip())


@python_app
def add(a: int, b: int) -> int:
    return a + b


@join_app
def tree_sum(values: list) -> Any:
    """The sum of ``values`` (futures or ints) as a tree of join apps."""
    if len(values) == 1:
        return add(values[0], 0)
    middle = len(values) // 2
    return add(tree_sum(values[:middle]), tree_sum(values[middle:]))


@bash_app
def concatenate(inputs: list = (), outputs: list = ()) -> str:
    files = " ".join(f.filepath for f in inputs)
    return f"cat {files} > {outputs[0].filepath}"


def _pilot_ends(config: Any) -> dict[str, int]:
    ends: dict[str, int] = {}
    for executor in config.executors:
        pilots = getattr(getattr(executor, "provider", None), "pilots", None) or {}
        for pilot in list(pilots.values()):
            why = pilot.reason or pilot.state.name.lower()
            ends[why] = ends.get(why, 0) + 1
    return ends


def main(argv: list[str] | None = None, config: Any = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML config (parsl-bf run passes it loaded)")
    parser.add_argument("--out", default="mapreduce-out", help="directory for the data files")
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--per-chunk", type=int, default=10)
    parser.add_argument("--pause", type=float, default=0.5, help="seconds each square app works")
    args = parser.parse_args(argv)
    if config is None:
        if not args.config:
            parser.error("--config is required")
        import parsl_bf

        config = parsl_bf.load_config(args.config)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    n, per = args.chunks, args.per_chunk
    with parsl.load(config):
        numbers = [
            write_numbers(i * per, per, outputs=[File(f"{out}/numbers-{i}.txt")]) for i in range(n)
        ]
        squares = [
            square_file(args.pause, inputs=[w.outputs[0]], outputs=[File(f"{out}/squares-{i}.txt")])
            for i, w in enumerate(numbers)
        ]
        sums = [sum_file(inputs=[s.outputs[0]]) for s in squares]
        total = tree_sum(sums)
        joined = concatenate(
            inputs=[s.outputs[0] for s in squares], outputs=[File(f"{out}/all-squares.txt")]
        )
        total_value = total.result()
        joined.result()
        counts = [s.result() for s in squares]
        apps = parsl.dfk().task_count
    with open(f"{out}/all-squares.txt") as f:
        lines = [int(x) for x in f if x.strip()]
    expected = sum(k * k for k in range(n * per))
    return {
        "apps": apps,
        "total": total_value,
        "total_ok": total_value == expected,
        "file_ok": sorted(lines) == [k * k for k in range(n * per)] and sum(counts) == n * per,
        "pilot_ends": _pilot_ends(config),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
