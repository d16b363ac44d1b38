"""A stock HighThroughputExecutor on one of our providers, and an app for it to run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from parsl.app.app import python_app
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.providers.base import ExecutionProvider

ROOT = Path(__file__).resolve().parents[2]


def stock_htex(
    provider: ExecutionProvider, run_dir: Path, monkeypatch, retries: int = 0, workers: int = 1
) -> Config:
    """Label "bf"; heartbeats fast enough that a preempted pilot's tasks are retried soon."""
    # HTEX starts interchange.py and process_worker_pool.py from PATH; its workers unpickle
    # this package's apps, so they need the checkout on their path.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    executor = HighThroughputExecutor(
        label="bf",
        provider=provider,
        max_workers_per_node=workers,
        heartbeat_period=1,
        heartbeat_threshold=6,
    )
    return Config(executors=[executor], retries=retries, strategy_period=1, run_dir=str(run_dir))


@python_app(executors=["bf"])
def square(x: int, pause: float = 0.0) -> int:
    import time

    time.sleep(pause)
    return x * x
