"""One communicator from ranks started by separate launchers (e.g. one ``mpiexec`` per pilot).

Groups 0..G-1 are independent MPI jobs (their own ``COMM_WORLD``). Group 0 opens an MPI port
(``MPI.Open_port``) and publishes its name in the rendezvous directory; groups 1..G-1 connect
in order (``Comm.Connect``), one at a time: group g connects once group g-1 has said it joined (a
``joined.<g-1>`` file), since a port accepts whoever connects first and every member of the
communicator so far must take part in each accept. After each connection the two sides merge
(``Intercomm.Merge``) into one intracommunicator that accepts the next group. Ranks end up
ordered by group, then by rank within the group. Needs an MPI with dynamic process support
across jobs (MPICH's Hydra does; the port name is a TCP address, so groups may be on different
hosts). The directory must be visible to all groups (a shared file system), or the port name
may be passed by other means (``port=``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from mpi4py import MPI

__all__ = ["join", "RendezvousTimeout"]


class RendezvousTimeout(TimeoutError):
    """A group did not show up in time."""


def _publish(path: Path, port: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(port)
    os.replace(tmp, path)


def _wait_for(path: Path, deadline: float, what: str) -> None:
    while not path.exists():
        if time.monotonic() > deadline:
            raise RendezvousTimeout(f"{what}: no {path} after the rendezvous' timeout")
        time.sleep(0.002)  # on the critical path of a fragment's start


def join(directory: str | Path, group: int, groups: int, timeout: float = 60.0) -> MPI.Intracomm:
    """The communicator of all ``groups`` groups; call on every rank of every group."""
    world = MPI.COMM_WORLD
    if groups == 1:
        return world.Dup()
    deadline = time.monotonic() + timeout
    d = Path(directory)
    port_file = d / "port"
    if group == 0:
        port = MPI.Open_port() if world.rank == 0 else None
        if world.rank == 0:
            d.mkdir(parents=True, exist_ok=True)
            _publish(port_file, port)
        comm = world
    else:
        port = None
        if world.rank == 0:
            _wait_for(port_file, deadline, f"group {group}")
            if group > 1:  # our turn comes after the group before us
                _wait_for(d / f"joined.{group - 1}", deadline, f"group {group}")
            port = port_file.read_text()
        comm = world.Connect(port, root=0).Merge(high=True)
        if world.rank == 0 and group < groups - 1:
            _publish(d / f"joined.{group}", "")
    for _ in range(group + 1, groups):  # accept the groups after this one, together
        comm = comm.Accept(port if comm.rank == 0 else None, root=0).Merge(high=False)
    if group == 0 and world.rank == 0:
        MPI.Close_port(port)
        port_file.unlink(missing_ok=True)
    return comm
