"""A node's GPUs as the agent counts them, and where a node's ranks are placed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parsl_bf import environment
from parsl_bf.pilot.gpus import node_gpus, visible_gpus
from parsl_bf.pilot.wire import MAX_GPUS
from parsl_bf.training.command import mpiexec_argv


@pytest.mark.parametrize(
    ("value", "count"),
    [
        ("0,1", 2),
        ("3", 1),
        ("", 0),  # every GPU hidden
        ("-1", 0),
        ("0,-1,2", 1),  # CUDA stops at the first entry that names no device
        ("NoDevFiles", 0),  # Slurm's value when the job has no GPU
        ("GPU-8f2a6c1e-0b1d-4c1e-9d6e-2f1b3c4d5e6f,MIG-1a2b", 2),
        (" 0, 1 ", 2),
    ],
)
def test_visible_gpus_reads_the_list_as_cuda_does(value: str, count: int) -> None:
    assert visible_gpus(value) == count


def test_the_visible_list_wins_over_the_drivers_devices(tmp_path: Path) -> None:
    driver = tmp_path / "gpus"
    for bus in ("0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0"):
        (driver / bus).mkdir(parents=True)
    assert node_gpus({}, driver) == 4
    assert node_gpus({environment.VISIBLE_GPUS: "1,3"}, driver) == 2
    assert node_gpus({environment.VISIBLE_GPUS: ""}, driver) == 0
    assert node_gpus({}, tmp_path / "no-driver") == 0  # a CPU node
    assert node_gpus({environment.VISIBLE_GPUS: ",".join(["0"] * 500)}, driver) == MAX_GPUS


def test_mpiexec_places_a_nodes_ranks_together() -> None:
    assert mpiexec_argv(2, None, "mpiexec") == ["mpiexec", "-n", "2"]
    assert mpiexec_argv(4, ["a", "b"], "mpiexec", per_node=2) == [
        *("mpiexec", "-n", "4", "-ppn", "2", "-hosts", "a,b")
    ]


def test_ranks_on_one_node_find_their_place_through_mpi(tmp_path: Path) -> None:
    """MPI's shared-memory split (the thread share's count, and the GPU choice's fallback)
    places two ranks of one ``mpiexec`` on one node, as Hydra's own variable does."""
    # Each rank writes a file of its own: ranks sharing mpiexec's stdout may mix their lines.
    probe = (
        "import json, sys; from mpi4py import MPI; "
        "from parsl_bf.training.trainer import local_rank, node_position; "
        "c = MPI.COMM_WORLD; "
        "open(f'{sys.argv[1]}/{c.rank}.json', 'w').write("
        "json.dumps([c.rank, *node_position(c), local_rank(c)]))"
    )
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    subprocess.run(
        [*mpiexec_argv(2), sys.executable, "-c", probe, str(tmp_path)],
        env=env,
        check=True,
        timeout=300,
    )
    places = sorted(json.loads(p.read_text()) for p in tmp_path.glob("*.json"))
    assert places == [[0, 0, 2, 0], [1, 1, 2, 1]]


_LAUNCHER_VARS = (environment.LOCAL_RANK, environment.LOCAL_RANKS, "OMPI_COMM_WORLD_LOCAL_RANK")
