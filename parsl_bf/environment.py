"""The environment variables parsl_bf reads and sets, named once.

A pilot's job script exports :data:`PILOT_JOB_ID`, :data:`PILOT_NODES` and :data:`PILOT_END`
for its agent (:mod:`parsl_bf.pilot.agent`); the executor sets :data:`THREADS_PER_RANK`
for the ranks of an emulated node, and the agent :data:`LOCAL_RANK` and :data:`LOCAL_RANKS`
for each rank of a node that runs several (one per GPU); the agent counts a node's GPUs from
:data:`VISIBLE_GPUS` where it is set; configs and workflows take :data:`DATA` as the data root.
"""

from __future__ import annotations

__all__ = [
    "DATA",
    "LOCAL_RANK",
    "LOCAL_RANKS",
    "PILOT_END",
    "PILOT_JOB_ID",
    "PILOT_NODES",
    "THREADS_PER_RANK",
    "VISIBLE_GPUS",
    "FORK_RANKS",
    "RANK_STEP_ENV",
]

#: The pilot's id: the Parsl job id its provider gave it.
PILOT_JOB_ID = "PARSL_BF_JOB_ID"
#: The pilot's hosts, comma-separated.
PILOT_NODES = "PARSL_BF_NODES"
#: When the pilot's walltime ends, in epoch seconds.
PILOT_END = "PARSL_BF_PILOT_END"
#: Torch threads per training rank (default: the cores of the node over its ranks).
THREADS_PER_RANK = "PARSL_BF_THREADS_PER_RANK"
#: A rank's index among the ranks of its node (0 … LOCAL_RANKS − 1): its GPU is
#: ``cuda:<LOCAL_RANK>``. Set by the agent for each rank it starts.
LOCAL_RANK = "PARSL_BF_LOCAL_RANK"
#: How many ranks the fragment runs on this rank's node (one per GPU, else one).
LOCAL_RANKS = "PARSL_BF_LOCAL_RANKS"
#: ``0``: a CPU node's fragment ranks start on standby processes rather than forked from the
#: pilot's rank host (a launcher that is not MPICH's Hydra is detected without it).
FORK_RANKS = "PARSL_BF_FORK_RANKS"
#: CUDA's own list of the GPUs a process may use (Slurm's ``--gpus`` and PBS's ``ngpus`` set
#: it); the agent honours it.
VISIBLE_GPUS = "CUDA_VISIBLE_DEVICES"
#: Where the traces and job sets are (``${PARSL_BF_DATA}`` in configs).
DATA = "PARSL_BF_DATA"
#: What a fragment's ranks' launcher runs with under a Slurm allocation. MPICH's Hydra starts
#: the proxy of every rank on another host as a job step (``srun``); by default a step waits
#: for CPUs that no other step of the job holds, and the pilot's own steps (ranks, a
#: predecessor still handing over, a plain app) hold them, so the launch would wait forever
#: (``step creation temporarily disabled``). Overlapping steps share the pilot's CPUs, as
#: processes of one allocation on one host do anyway. Only srun reads it.
RANK_STEP_ENV = {"SLURM_OVERLAP": "1"}
