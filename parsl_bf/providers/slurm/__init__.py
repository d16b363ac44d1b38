"""Slurm: hole discovery (every Slurm command is in ``commands``) and the backfill provider."""

from .commands import Hole, SlurmCommandError, holes
from .provider import SlurmBackfillProvider

__all__ = ["Hole", "SlurmBackfillProvider", "SlurmCommandError", "holes"]
