"""Parsl execution providers that ask for preemptible backfill pilots sized to the holes."""

from ..checks import SettingError
from .base import BackfillProvider, Pilot, SchedulerError, parse_walltime
from .handlers import BackfillErrorHandler, PreemptionRetries
from .local import LocalBackfillProvider
from .pbs import PBSProBackfillProvider
from .pilots import PilotProvider
from .sizing import Hole, PilotRequest, size_pilot
from .slurm import SlurmBackfillProvider

__all__ = [
    "BackfillErrorHandler",
    "BackfillProvider",
    "Hole",
    "LocalBackfillProvider",
    "PBSProBackfillProvider",
    "Pilot",
    "PilotProvider",
    "PilotRequest",
    "PreemptionRetries",
    "SchedulerError",
    "SettingError",
    "SlurmBackfillProvider",
    "parse_walltime",
    "size_pilot",
]
