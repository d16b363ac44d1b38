"""Parsl execution providers that ask for preemptible backfill pilots sized to the holes."""

from .base import Pilot, SchedulerError, parse_walltime
from .local import LocalBackfillProvider
from .pbs import PBSProBackfillProvider
from .sizing import Hole, PilotRequest, size_pilot
from .slurm import SlurmBackfillProvider

__all__ = [
    "Hole",
    "LocalBackfillProvider",
    "PBSProBackfillProvider",
    "Pilot",
    "PilotRequest",
    "SchedulerError",
    "SlurmBackfillProvider",
    "parse_walltime",
    "size_pilot",
]
