"""A script of ``benchmarks/`` imported as a module, for the tests of its pure parts."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@contextmanager
def benchmark(name: str) -> Iterator[ModuleType]:
    """``benchmarks/<name>.py`` as a module; its directory is on ``sys.path`` meanwhile, for
    the imports between benchmarks."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
