"""Elastic data-parallel training fragments on mpi4py: flat-buffer Allreduce, exact sample
accounting, atomic checkpoints, resume at any world size.

The names below are imported on first use (PEP 562), so that processes that need only the
package's light modules (the pilot agent reads :mod:`.command`) do not import torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .checkpoint import CheckpointError, load_latest, save_checkpoint
    from .data import epoch_order, rank_share, step_indices
    from .exchange import FlatGradients
    from .reports import ReportSink, ScalingProfiler, read_reports
    from .trainer import ElasticTrainer, TrainingInputError, TrainingTask, TrainOutcome

_WHERE = {
    "CheckpointError": "checkpoint",
    "load_latest": "checkpoint",
    "save_checkpoint": "checkpoint",
    "epoch_order": "data",
    "rank_share": "data",
    "step_indices": "data",
    "FlatGradients": "exchange",
    "ReportSink": "reports",
    "ScalingProfiler": "reports",
    "read_reports": "reports",
    "ElasticTrainer": "trainer",
    "TrainingInputError": "trainer",
    "TrainingTask": "trainer",
    "TrainOutcome": "trainer",
}

__all__ = [
    "CheckpointError",
    "ElasticTrainer",
    "FlatGradients",
    "ReportSink",
    "ScalingProfiler",
    "TrainOutcome",
    "TrainingInputError",
    "TrainingTask",
    "epoch_order",
    "load_latest",
    "rank_share",
    "read_reports",
    "save_checkpoint",
    "step_indices",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value
