"""The policies the replay compares, by name: the same objects the BackfillExecutor uses."""

from __future__ import annotations

from ..allocation.heuristics import equal_share, greedy
from ..allocation.policy import POLICIES, AllocatorSettings, Policy

__all__ = ["Policy", "POLICIES", "make_policy", "equal_share", "greedy"]


def make_policy(name: str, time_limit: float = 10.0) -> AllocatorSettings:
    """The policy called ``name`` (one of :data:`POLICIES`)."""
    from ..allocation import AllocationInputError

    if name not in POLICIES:
        raise AllocationInputError("policy", f"unknown policy {name!r} ({', '.join(POLICIES)})")
    return AllocatorSettings(policy=name, time_limit=time_limit)
