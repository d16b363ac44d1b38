"""Parsl's own generic test suite against the BackfillExecutor on SlurmBackfillProvider pilots,
on the loopback Slurm cluster (`scripts/parsl-suite.sh PYTHON backfill-slurm` brings one up;
with HOSTS=netns its nodes are separate hosts, which reach this machine at PARSL_BF_ADDRESS).
"""

import os

from parsl.config import Config
from parsl.launchers import SimpleLauncher

from parsl_bf.executor import BackfillExecutor
from parsl_bf.providers import SlurmBackfillProvider


def fresh_config() -> Config:
    # No main jobs: the holes are the whole idle cluster, without end. One agent per pilot.
    provider = SlurmBackfillProvider(
        partition="backfill",
        min_nodes=1,
        max_nodes=2,
        min_walltime="00:02:00",
        max_walltime="02:00:00",
        launcher=SimpleLauncher(),
        init_blocks=1,
        max_blocks=2,
        status_polling_interval=2,
    )
    address = os.environ.get("PARSL_BF_ADDRESS", "127.0.0.1")
    executor = BackfillExecutor(label="backfill_slurm", provider=provider, address=address)
    return Config(executors=[executor])
