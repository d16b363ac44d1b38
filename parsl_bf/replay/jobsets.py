"""Readers for BFTrainer job sets (``jobs/*.json`` or ``*.csv`` of the bftrainer-dev data)."""

from __future__ import annotations

import csv
import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from ..allocation import AllocationInputError, TaskSpec
from ..allocation.errors import json_line
from ..environment import DATA
from ..inputs.errors import (
    MAX_JOBS,
    MAX_SECONDS,
    MAX_WORK,
    ReplayInputError,
    csv_errors,
    integer,
    json_error,
    number,
    read_json,
    text_lines,
)

__all__ = ["Job", "load_job_set", "default_data_dir", "missing_data"]


def default_data_dir() -> Path:
    """``$PARSL_BF_DATA``, else ``../shared/data/bftrainer-dev`` beside the checkout."""
    if os.environ.get(DATA):
        return Path(os.environ[DATA])
    return Path(__file__).resolve().parents[3] / "shared" / "data" / "bftrainer-dev"


def missing_data() -> str | None:
    """Why the week's trace and job sets cannot be read from :func:`default_data_dir` (a
    line for the user); None when both are there."""
    data = default_data_dir()
    for part in ("trace", "jobs"):
        if not (data / part).is_dir():
            return f"the bftrainer-dev {part} is not under {data} (set {DATA})"
    return None


@dataclass(frozen=True)
class Job:
    """One elastic training job of a job set."""

    id: str
    model: str
    submit_s: float  # seconds after the trace window start
    min_nodes: int
    max_nodes: int
    rescale_up_s: float
    rescale_down_s: float
    work: float  # total samples
    nodes: tuple[int, ...]
    throughput: tuple[float, ...]
    value: tuple[float, ...]
    #: Seconds a start from zero nodes costs (process start → first step), charged only with
    #: ``ReplayConfig.charge_starts``; None: ``rescale_up_s``. Job set files do not carry it:
    #: it is what a real run measured (``benchmarks/executor.py``).
    start_s: float | None = None

    @functools.cached_property
    def p1(self) -> float:
        """P(1), the curve interpolated at one node (``min_nodes`` aside): the unit in which
        E_avail, its bound and the replay's charges count this job's samples."""
        return float(np.interp(1, self.nodes, self.throughput))

    def task(self, current_nodes: int = 0, remaining_work: float | None = None) -> TaskSpec:
        """This job as the allocator sees it at one event."""
        return TaskSpec(
            id=self.id,
            min_nodes=self.min_nodes,
            max_nodes=self.max_nodes,
            current_nodes=current_nodes,
            nodes=self.nodes,
            throughput=self.throughput,
            value=None if self.value == self.throughput else self.value,
            rescale_up_s=self.rescale_up_s,
            rescale_down_s=self.rescale_down_s,
            remaining_work=remaining_work,
        )


_COLUMNS = (
    "job",
    "model",
    "submit_window_s",
    "jmin",
    "jmax",
    "rescale_up_s",
    "rescale_down_s",
    "total_work_samples",
    "nodes",
    "throughput",
    "objective",
)
# The allocator's names of a job's fields, in the job set's words.
_FIELDS = {"min_nodes": "jmin", "max_nodes": "jmax", "value": "objective"}


def _curve(value: Any, integral: bool) -> tuple:
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {type(value).__name__}")
    if integral:
        return tuple(integer(x, -(10**9), 10**9) for x in value)
    return tuple(number(x, -1e300, 1e300) for x in value)


def _job(row: dict, path: Path, line: int | None, where: str, text: str = "") -> Job:
    """One row as a Job; errors name the file, the line (CSV) or entry (JSON), and the field."""

    def error(key: str, message: str) -> ReplayInputError:
        field = f"{where}{key}"
        if line is None and text:  # a JSON entry: the line of its field
            return json_error(path, text, field, message)
        return ReplayInputError(path, message, line, field)

    for key in _COLUMNS:
        if row.get(key) is None:
            raise error(key, "missing")
    values: dict[str, Any] = {}
    checks = {
        "submit_window_s": lambda v: number(v, 0, MAX_SECONDS),
        "jmin": lambda v: integer(v, -(10**9), 10**9),
        "jmax": lambda v: integer(v, -(10**9), 10**9),
        "rescale_up_s": lambda v: number(v, -1e300, 1e300),
        "rescale_down_s": lambda v: number(v, -1e300, 1e300),
        "total_work_samples": lambda v: number(v, -1e300, 1e300),
        "nodes": lambda v: _curve(v, True),
        "throughput": lambda v: _curve(v, False),
        "objective": lambda v: _curve(v, False),
    }
    for key, check in checks.items():
        try:
            values[key] = check(row[key])
        except ValueError as exc:
            raise error(key, str(exc)) from None
    for key in ("job", "model"):
        if not isinstance(row[key], str | int) or isinstance(row[key], bool) or row[key] == "":
            raise error(key, f"expected a name, got {row[key]!r}")
    job = Job(
        id=str(row["job"]),
        model=str(row["model"]),
        submit_s=values["submit_window_s"],
        min_nodes=values["jmin"],
        max_nodes=values["jmax"],
        rescale_up_s=values["rescale_up_s"],
        rescale_down_s=values["rescale_down_s"],
        work=values["total_work_samples"],
        nodes=values["nodes"],
        throughput=values["throughput"],
        value=values["objective"],
    )
    if not 0 < job.work <= MAX_WORK:
        raise error("total_work_samples", f"must be positive and at most {MAX_WORK:g}")
    try:
        job.task()  # the allocator's own checks: curve from 0 nodes, increasing, bounds
    except ValidationError as exc:
        err = AllocationInputError.from_validation(exc)
        field = re.sub(r"^(\w+)", lambda m: _FIELDS.get(m.group(1), m.group(1)), err.field)
        raise error(field, err.message) from None
    return job


def _unique(jobs: list[tuple[Job, int | None]], path: Path, text: str) -> None:
    """No job id twice; each job comes with its CSV line (None: entry i of a JSON set)."""
    seen: dict[str, int] = {}
    for i, (job, line) in enumerate(jobs):
        if job.id not in seen:
            seen[job.id] = i
            continue
        first, first_line = seen[job.id], jobs[seen[job.id]][1]
        if line is not None:
            raise ReplayInputError(
                path, f"duplicate job id {job.id!r} (also line {first_line})", line, "job"
            )
        also = f"jobs[{first}], line {json_line(text, f'jobs[{first}]')}"
        raise json_error(path, text, f"jobs[{i}].job", f"duplicate job id {job.id!r} (also {also})")


def load_job_set(path: str | Path) -> list[Job]:
    """Jobs of a set, in submission order; ``path`` is the ``.json`` or ``.csv`` file.

    Checked as untrusted input: at most :data:`~parsl_bf.inputs.errors.MAX_JOBS` jobs, unique
    ids, finite numbers (submission times within
    :data:`~parsl_bf.inputs.errors.MAX_SECONDS`, positive work of at most
    :data:`~parsl_bf.inputs.errors.MAX_WORK` samples) and the allocator's checks of every curve.
    """
    path = Path(path)
    jobs: list[tuple[Job, int | None]] = []
    text = ""
    if path.suffix == ".json":
        data, text = read_json(path)
        if not isinstance(data, dict) or "jobs" not in data:
            raise ReplayInputError(path, "not a job-set JSON: expected an object with 'jobs'", 1)
        rows = data["jobs"]
        if not isinstance(rows, list):
            raise json_error(path, text, "jobs", f"expected a list of jobs, got {rows!r:.40}")
        if len(rows) > MAX_JOBS:
            raise json_error(path, text, "jobs", f"more than {MAX_JOBS} jobs")
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise json_error(path, text, f"jobs[{i}]", f"expected an object, got {row!r:.40}")
            jobs.append((_job(row, path, None, f"jobs[{i}].", text), None))
    else:
        reader = csv.DictReader(text_lines(path))
        with csv_errors(path, reader):
            for row in reader:
                if len(jobs) >= MAX_JOBS:
                    raise ReplayInputError(path, f"more than {MAX_JOBS} jobs", reader.line_num)
                for key in ("nodes", "throughput", "objective"):
                    if row.get(key) is None:
                        continue  # _job reports the missing column
                    try:
                        row[key] = json.loads(row[key])
                    except (ValueError, RecursionError):
                        raise ReplayInputError(
                            path, "not a JSON list", reader.line_num, key
                        ) from None
                jobs.append((_job(row, path, reader.line_num, ""), reader.line_num))
    if not jobs:
        raise ReplayInputError(path, "no jobs")
    _unique(jobs, path, text)
    return sorted((job for job, _ in jobs), key=lambda j: j.submit_s)
