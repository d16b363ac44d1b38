"""PBS Pro: hole discovery (every PBS command is in ``commands``) and the backfill provider."""

from .commands import Hole, PBSCommandError, holes
from .provider import PBSProBackfillProvider, pilot_from_job

__all__ = ["Hole", "PBSCommandError", "PBSProBackfillProvider", "holes", "pilot_from_job"]
