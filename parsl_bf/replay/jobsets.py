"""Readers for BFTrainer job sets (``jobs/*.json`` or ``*.csv`` of the bftrainer-dev data)."""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..allocation import TaskSpec

__all__ = ["Job", "load_job_set", "default_data_dir"]

_DATA_ENV = "PARSL_BF_DATA"


def default_data_dir() -> Path:
    """``$PARSL_BF_DATA``, else ``../shared/data/bftrainer-dev`` beside the checkout."""
    if os.environ.get(_DATA_ENV):
        return Path(os.environ[_DATA_ENV])
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


def _job(row: dict) -> Job:
    return Job(
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


def load_job_set(path: str | Path) -> list[Job]:
    """Jobs of a set, in submission order; ``path`` is the ``.json`` or ``.csv`` file."""
    path = Path(path)
    if path.suffix == ".json":
        rows = json.loads(path.read_text())["jobs"]
    else:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        for row in rows:
            for key in ("nodes", "throughput", "objective"):
                row[key] = json.loads(row[key])
    return sorted((_job(r) for r in rows), key=lambda j: j.submit_s)
