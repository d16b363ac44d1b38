"""Errors raised by the allocator."""

from __future__ import annotations

import re

from pydantic import ValidationError

__all__ = ["AllocationError", "AllocationInputError", "SolverUnavailableError", "PlanError"]

_FIELD_IN_MESSAGE = re.compile(r"^(?:Value error, )?(?:(\w+): )?(.*)$", re.S)


class AllocationError(Exception):
    """Base class of the allocator's errors."""


class AllocationInputError(AllocationError, ValueError):
    """Bad input: ``field`` is a path such as ``tasks[2].min_nodes``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message

    @classmethod
    def from_validation(cls, exc: ValidationError) -> AllocationInputError:
        """The first pydantic error, as one line naming the field."""
        errors = exc.errors()
        err = errors[0]
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        m = _FIELD_IN_MESSAGE.match(err["msg"])
        assert m is not None  # the pattern matches any string
        inner, message = m.group(1), m.group(2)
        if inner:
            path = f"{path}.{inner}" if path else inner
        if err["type"] == "extra_forbidden":
            message = "unknown key"
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
        return cls(path, message)


class SolverUnavailableError(AllocationError, RuntimeError):
    """The MILP solver (GLPK's ``glpsol``) cannot be run."""


class PlanError(AllocationError, ValueError):
    """Counts that cannot be mapped to nodes without migration."""
