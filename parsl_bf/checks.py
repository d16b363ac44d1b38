"""Checks of constructor arguments that every configurable class shares (the providers, the
executor): each raises :class:`SettingError` naming the argument, so that the YAML loader
(:mod:`parsl_bf.config`) can point at that key's own line. Imports nothing of parsl_bf or
Parsl."""

from __future__ import annotations

import math
import numbers

__all__ = ["SettingError", "check_count", "check_number"]


class SettingError(ValueError):
    """A constructor argument that is out of range or inconsistent.

    ``field`` names the argument, so that the YAML loader can point at that key's own line;
    ``message`` says what is wrong without the name. ``str()`` has both (``"nodes: must be at
    least 1, got -3"``), for Python configs.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def check_count(name: str, value: object, minimum: int = 1) -> int:
    """``value`` if it is an int of at least ``minimum``, else :class:`SettingError`."""
    # bool is an int subclass, but ``nodes: true`` is a mistake, not one node.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SettingError(name, f"expected an integer, got {value!r}")
    if value < minimum:
        raise SettingError(name, f"must be at least {minimum}, got {value!r}")
    return int(value)


def check_number(
    name: str,
    value: object,
    *,
    above: float | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
) -> float:
    """``value`` as a float if it is a finite number within the bounds given (``above``:
    strictly greater), else :class:`SettingError`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SettingError(name, f"expected a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):  # nan fails every comparison, so it would pass them all
        raise SettingError(name, f"must be a finite number, got {value!r}")
    if above is not None and not number > above:
        raise SettingError(name, f"must be more than {above:g}, got {value!r}")
    if at_least is not None and number < at_least:
        raise SettingError(name, f"must be at least {at_least:g}, got {value!r}")
    if at_most is not None and number > at_most:
        raise SettingError(name, f"must be at most {at_most:g}, got {value!r}")
    return number
