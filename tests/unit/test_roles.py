"""The controller and the executor are each one class made of roles (one module each, see
docs/design.md §2). A role must never define what another role of the same class defines:
the first in the method resolution order would silently win, and the other's code never run."""

from __future__ import annotations

import pytest

from parsl_bf.executor.controller import Controller
from parsl_bf.executor.executor import BackfillExecutor


@pytest.mark.parametrize("cls", [Controller, BackfillExecutor])
def test_no_role_defines_what_another_role_does(cls) -> None:
    ours = [c for c in cls.__mro__ if c.__module__.startswith("parsl_bf.")]
    assert len(ours) > 2  # the class, its roles and their state
    defined: dict[str, str] = {}
    for role in ours:
        for name, value in vars(role).items():
            if name.startswith("__") or not (callable(value) or isinstance(value, property)):
                continue
            assert name not in defined, f"{name}: in {defined[name]} and in {role.__name__}"
            defined[name] = role.__name__
    # What each role calls on another is there, in that other role.
    for name in ("_carry_out", "_not_carried_out", "_arrived", "handle", "_stop", "_decide"):
        if hasattr(cls, name):
            assert defined.get(name) not in (None, "ShellState", "ControllerState"), name
