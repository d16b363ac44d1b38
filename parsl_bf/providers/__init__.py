"""Parsl execution providers that ask for preemptible backfill pilots sized to the holes."""

from .base import Pilot, SchedulerError, SettingError, parse_walltime
from .handlers import BackfillErrorHandler, PreemptionRetries
from .local import LocalBackfillProvider
from .pbs import PBSProBackfillProvider
from .sizing import Hole, PilotRequest, size_pilot
from .slurm import SlurmBackfillProvider

__all__ = [
    "BackfillErrorHandler",
    "Hole",
    "LocalBackfillProvider",
    "PBSProBackfillProvider",
    "Pilot",
    "PilotRequest",
    "PreemptionRetries",
    "SchedulerError",
    "SettingError",
    "SlurmBackfillProvider",
    "parse_walltime",
    "size_pilot",
]
