"""Polling for tests that wait on real processes and daemons."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(pred: Callable[[], object], timeout: float = 30.0, what: str = "timed out") -> None:
    """Return once ``pred()`` is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
