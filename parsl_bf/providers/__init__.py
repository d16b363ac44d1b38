"""Parsl execution providers that ask for preemptible backfill pilots sized to the holes."""

from .base import Pilot, parse_walltime
from .local import LocalBackfillProvider

__all__ = ["LocalBackfillProvider", "Pilot", "parse_walltime"]
