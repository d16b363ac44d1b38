"""Errors raised by the allocator."""

from __future__ import annotations

import json
import re

from pydantic import ValidationError

__all__ = [
    "AllocationError",
    "AllocationInputError",
    "SolverUnavailableError",
    "PlanError",
    "json_line",
]

_FIELD_IN_MESSAGE = re.compile(r"^(?:Value error, )?(?:(\w+): )?(.*)$", re.S)
_WS = re.compile(r"[ \t\n\r]*")
_PART = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


def _past_ws(text: str, pos: int = 0) -> int:
    """The index of the first non-blank character of ``text`` from ``pos`` on."""
    match = _WS.match(text, pos)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def json_line(text: str, field: str) -> int:
    """The line of ``field`` (``tasks[2].min_nodes``) in the JSON ``text``: of its value, or
    of the deepest part of the path that is there (the line of the first value on failure)."""
    decoder = json.JSONDecoder()
    pos = found = _past_ws(text)
    try:
        for index, key in _PART.findall(field):
            part: str | int = int(index) if index else key
            at, i, k = None, _past_ws(text, pos + 1), 0
            if text[pos] == "{" and isinstance(part, str):
                while text[i] == '"':
                    name, i = decoder.raw_decode(text, i)  # a string: text[i] is its quote
                    i = _past_ws(text, _past_ws(text, i) + 1)  # past ':'
                    if name == part:
                        at = i
                        break
                    i = _past_ws(text, decoder.raw_decode(text, i)[1])
                    i = _past_ws(text, i + 1) if text[i] == "," else i
            elif text[pos] == "[" and isinstance(part, int):
                while text[i] != "]":
                    if k == part:
                        at = i
                        break
                    i = _past_ws(text, decoder.raw_decode(text, i)[1])
                    i = _past_ws(text, i + 1) if text[i] == "," else i
                    k += 1
            if at is None:
                break
            pos = found = at
    except (IndexError, ValueError, RecursionError):  # through something else: the last found
        pass
    return text.count("\n", 0, found) + 1


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
