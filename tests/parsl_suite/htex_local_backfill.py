"""Parsl's own generic test suite against a stock HTEX on LocalBackfillProvider pilots.

    pytest "$(python -c 'import os, parsl.tests; print(os.path.dirname(parsl.tests.__file__))')" \
        --config tests/parsl_suite/htex_local_backfill.py -k "<see scripts/run-tests.sh>"
"""

from parsl.config import Config
from parsl.executors import HighThroughputExecutor

from parsl_bf.providers import LocalBackfillProvider


def fresh_config() -> Config:
    # Long synthetic holes: the suite tests apps and futures, not preemption.
    provider = LocalBackfillProvider(
        nodes=2,
        time_scale=1,
        idle_s=86400,
        busy_s=60,
        init_blocks=1,
        min_blocks=0,
        max_blocks=1,
        min_walltime="00:00:10",
        max_walltime="02:00:00",
    )
    return Config(
        executors=[
            HighThroughputExecutor(
                label="htex_local_backfill", provider=provider, max_workers_per_node=4
            )
        ]
    )
