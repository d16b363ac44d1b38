"""How many GPUs a pilot node gives its fragment ranks: one rank runs per GPU.

The agent counts them without importing torch or starting CUDA (it must stay light): where
``CUDA_VISIBLE_DEVICES`` is set it is the answer, read as CUDA reads it, since the batch
scheduler (Slurm's ``--gpus``, PBS's ``ngpus``) or the user restricted the node's devices
with it; otherwise the devices the NVIDIA driver lists under ``/proc/driver/nvidia/gpus``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from .. import environment
from .wire import MAX_GPUS

__all__ = ["MAX_GPUS", "node_gpus", "visible_gpus"]

#: The NVIDIA driver's directory of one entry per device it drives.
DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")

# An index, or a device's UUID as nvidia-smi prints it (GPU-…, MIG-…).
_DEVICE = re.compile(r"\d+|(?:GPU|MIG)-[0-9A-Za-z-]+")


def visible_gpus(value: str) -> int:
    """The devices a ``CUDA_VISIBLE_DEVICES`` value leaves visible.

    CUDA takes the list up to its first entry that names no device: ``""`` and ``"-1"``
    hide every GPU, ``"0,-1,2"`` leaves one, and so does Slurm's ``"NoDevFiles"`` none.
    """
    count = 0
    for entry in value.split(","):
        if not _DEVICE.fullmatch(entry.strip()):
            break
        count += 1
    return count


def node_gpus(env: Mapping[str, str] | None = None, driver: Path = DRIVER_GPUS) -> int:
    """This node's GPUs for fragment ranks (0 on a CPU node), at most :data:`MAX_GPUS`."""
    env = os.environ if env is None else env
    if environment.VISIBLE_GPUS in env:
        count = visible_gpus(env[environment.VISIBLE_GPUS])
    else:
        try:
            count = sum(1 for _ in driver.iterdir())
        except OSError:  # no NVIDIA driver: a CPU node
            count = 0
    return min(count, MAX_GPUS)
