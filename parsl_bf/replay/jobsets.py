"""Readers for BFTrainer job sets (``jobs/*.json`` or ``*.csv`` of the bftrainer-dev data)."""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ..allocation import AllocationInputError, TaskSpec
from ..environment import DATA
from .errors import ReplayInputError

__all__ = ["Job", "load_job_set", "default_data_dir"]


def default_data_dir() -> Path:
    """``$PARSL_BF_DATA``, else ``../shared/data/bftrainer-dev`` beside the checkout."""
    if os.environ.get(DATA):
        return Path(os.environ[DATA])
    return Path(__file__).resolve().parents[3] / "shared" / "data" / "bftrainer-dev"


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


def _job(row: dict, path: Path, line: int | None, where: str) -> Job:
    """One row as a Job; errors name the file, the line (CSV) or entry (JSON), and the field."""
    for key in _COLUMNS:
        if key not in row:
            raise ReplayInputError(path, "missing", line, f"{where}{key}")
    try:
        job = Job(
            id=str(row["job"]),
            model=str(row["model"]),
            submit_s=float(row["submit_window_s"]),
            min_nodes=int(row["jmin"]),
            max_nodes=int(row["jmax"]),
            rescale_up_s=float(row["rescale_up_s"]),
            rescale_down_s=float(row["rescale_down_s"]),
            work=float(row["total_work_samples"]),
            nodes=tuple(int(x) for x in row["nodes"]),
            throughput=tuple(float(x) for x in row["throughput"]),
            value=tuple(float(x) for x in row["objective"]),
        )
    except (TypeError, ValueError) as exc:
        raise ReplayInputError(path, f"bad value: {exc}", line, where.rstrip(".")) from None
    if job.work <= 0:
        raise ReplayInputError(path, "must be positive", line, f"{where}total_work_samples")
    try:
        job.task()  # the allocator's own checks: curve from 0 nodes, increasing, bounds
    except ValidationError as exc:
        err = AllocationInputError.from_validation(exc)
        field = {"min_nodes": "jmin", "max_nodes": "jmax", "value": "objective"}.get(
            err.field, err.field
        )
        raise ReplayInputError(path, err.message, line, f"{where}{field}") from None
    return job


def load_job_set(path: str | Path) -> list[Job]:
    """Jobs of a set, in submission order; ``path`` is the ``.json`` or ``.csv`` file."""
    path = Path(path)
    jobs: list[Job] = []
    if path.suffix == ".json":
        try:
            rows = json.loads(path.read_text())["jobs"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ReplayInputError(path, f"not a job-set JSON ({exc})") from None
        jobs = [_job(row, path, None, f"jobs[{i}].") for i, row in enumerate(rows)]
    else:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            for row in reader:
                for key in ("nodes", "throughput", "objective"):
                    if row.get(key) is None:
                        continue  # _job reports the missing column
                    try:
                        row[key] = json.loads(row[key])
                    except json.JSONDecodeError:
                        raise ReplayInputError(
                            path, "not a JSON list", reader.line_num, key
                        ) from None
                jobs.append(_job(row, path, reader.line_num, ""))
    if not jobs:
        raise ReplayInputError(path, "no jobs")
    return sorted(jobs, key=lambda j: j.submit_s)
