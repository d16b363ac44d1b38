"""The environment variables parsl_bf reads and sets, named once.

A pilot's job script exports :data:`PILOT_JOB_ID`, :data:`PILOT_NODES` and :data:`PILOT_END`
for its agent (:mod:`parsl_bf.executor.agent`); the executor sets :data:`THREADS_PER_RANK`
for the ranks of an emulated node; configs and workflows take :data:`DATA` as the data root.
"""

from __future__ import annotations

__all__ = ["DATA", "PILOT_END", "PILOT_JOB_ID", "PILOT_NODES", "THREADS_PER_RANK"]

#: The pilot's id: the Parsl job id its provider gave it.
PILOT_JOB_ID = "PARSL_BF_JOB_ID"
#: The pilot's hosts, comma-separated.
PILOT_NODES = "PARSL_BF_NODES"
#: When the pilot's walltime ends, in epoch seconds.
PILOT_END = "PARSL_BF_PILOT_END"
#: Torch threads per training rank (default: the cores of the node over its ranks).
THREADS_PER_RANK = "PARSL_BF_THREADS_PER_RANK"
#: Where the traces and job sets are (``${PARSL_BF_DATA}`` in configs).
DATA = "PARSL_BF_DATA"
