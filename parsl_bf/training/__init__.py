"""Elastic data-parallel training fragments on mpi4py: flat-buffer Allreduce, exact sample
accounting, atomic checkpoints, resume at any world size."""

from .checkpoint import CheckpointError, load_latest, save_checkpoint
from .data import epoch_order, rank_share, step_indices
from .exchange import FlatGradients
from .reports import ReportSink, ScalingProfiler, read_reports
from .trainer import ElasticTrainer, TrainingInputError, TrainingTask, TrainOutcome

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
