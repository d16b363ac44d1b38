"""Parsl's own generic test suite against a stock HTEX on SlurmBackfillProvider pilots, on the
loopback Slurm cluster (`scripts/parsl-suite.sh PYTHON slurm` brings one up; SLURM_CONF set).
"""

from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.launchers import SrunLauncher

from parsl_bf.providers import SlurmBackfillProvider


def fresh_config() -> Config:
    # No main jobs: the holes are the whole idle cluster, without end. The suite tests apps and
    # futures on pilots that srun the workers, not preemption (the integration tests do).
    provider = SlurmBackfillProvider(
        partition="backfill",
        min_nodes=1,
        max_nodes=2,
        min_walltime="00:02:00",
        max_walltime="02:00:00",
        launcher=SrunLauncher(),
        init_blocks=1,
        max_blocks=1,
        status_polling_interval=2,
    )
    return Config(
        executors=[
            HighThroughputExecutor(
                label="htex_slurm_backfill", provider=provider, max_workers_per_node=2
            )
        ]
    )
