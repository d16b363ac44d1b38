"""Parsl's own generic test suite against the BackfillExecutor on LocalBackfillProvider pilots
(`scripts/parsl-suite.sh PYTHON backfill`).
"""

from parsl.config import Config

from parsl_bf.executor import BackfillExecutor
from parsl_bf.providers import LocalBackfillProvider


def fresh_config() -> Config:
    # Long synthetic holes: the suite tests apps and futures, not preemption (our own tests do).
    provider = LocalBackfillProvider(
        nodes=4,
        time_scale=1,
        idle_s=86400,
        busy_s=60,
        init_blocks=1,
        min_blocks=0,
        max_blocks=2,
        max_nodes=2,
        min_walltime="00:00:10",
        max_walltime="02:00:00",
    )
    return Config(executors=[BackfillExecutor(label="backfill_local", provider=provider)])
