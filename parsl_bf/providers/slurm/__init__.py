"""Slurm: hole discovery so far (the provider itself is not built yet)."""

from .commands import Hole, SlurmCommandError, holes

__all__ = ["Hole", "SlurmCommandError", "holes"]
