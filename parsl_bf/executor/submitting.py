"""An app's submission as an elastic task: its identity across runs (the checkpoint key) and
its TrainingTask factory file."""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

from parsl.serialize import pack_apply_message

from .lifecycle import TaskDir

__all__ = ["task_key", "factory_file", "code_name", "count_of"]


def task_key(spec: dict[str, Any], func, args, kwargs) -> str:
    """An elastic task's identity across runs: its ``name``, else a digest of what it trains
    (code, options, work, the app's arguments, as Parsl's memoization serialises them); a
    ``run-<uuid>`` when its arguments cannot be (it then starts afresh in every run)."""
    if spec.get("name"):
        name = str(spec["name"])
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.=-]{0,127}", name):
            raise ValueError(f"task name {name!r}: use letters, digits and _ . = - (≤ 128)")
        return name
    from parsl.dataflow.memoization import id_for_memo

    what = [code_name(func), spec.get("task"), spec.get("options"), spec["work"], args, kwargs]
    try:
        digest = hashlib.sha256(id_for_memo(what)).hexdigest()[:20]
    except ValueError:  # an argument Parsl cannot memoize
        return f"run-{uuid.uuid4().hex[:20]}"
    trains = spec.get("task") or code_name(func)
    return f"{trains.rpartition(':')[2][:40]}-{digest}"


def factory_file(directory: TaskDir, func, args, kwargs) -> str:
    """The app's own function is the TrainingTask factory: the ranks call it."""
    directory.factory.write_bytes(pack_apply_message(func, args, kwargs))
    return f"@{directory.factory}"


def code_name(func) -> str:
    """``module:qualname`` of an app's function (any callable)."""
    name = getattr(func, "__qualname__", None) or type(func).__qualname__
    return f"{getattr(func, '__module__', None) or type(func).__module__}:{name}"


def count_of(value: object) -> int:
    """An outcome's count, 0 when missing or not a number (a file from elsewhere)."""
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return 0
