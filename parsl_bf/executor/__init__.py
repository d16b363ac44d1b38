"""The BackfillExecutor: elastic training fragments packed onto live pilots by the MILP.

Names are imported on first use, so the pure controller loads without ZeroMQ or Parsl's
executor machinery.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["BackfillExecutor", "Controller", "ELASTIC_KEYS", "FragmentFailed", "elastic_app"]

_WHERE = {
    "BackfillExecutor": "executor",
    "ELASTIC_KEYS": "executor",
    "FragmentFailed": "executor",
    "Controller": "controller",
    "elastic_app": "apps",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
