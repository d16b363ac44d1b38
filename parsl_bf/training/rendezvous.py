"""One communicator from ranks started by separate launchers (e.g. one ``mpiexec`` per pilot).

Groups 0..G-1 are independent MPI jobs (their own ``COMM_WORLD``). Group 0 opens an MPI port
(``MPI.Open_port``) and publishes its name in the rendezvous directory; groups 1..G-1 connect
in order (``Comm.Connect``), one at a time: group g connects once group g-1 has said it joined (a
``joined.<g-1>`` file), since a port accepts whoever connects first and every member of the
communicator so far must take part in each accept. After each connection the two sides merge
(``Intercomm.Merge``) into one intracommunicator that accepts the next group. Ranks end up
ordered by group, then by rank within the group. Needs an MPI with dynamic process support
across jobs (MPICH's Hydra does; the port name is a TCP address, so groups may be on different
hosts). The directory must be visible to all groups (a shared file system).

The same protocol grows a running fragment in place (:mod:`.resize`): the fragment is group 0,
with its own communicator as ``base``, and the groups after it are the joiners.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from mpi4py import MPI

__all__ = [
    "join",
    "refuse",
    "RendezvousError",
    "RendezvousRefused",
    "RendezvousTimeout",
]

#: What group 0 publishes in place of its port when it will not take the others in.
REFUSED = "refused"


class RendezvousError(Exception):
    """A group could not join."""


class RendezvousTimeout(RendezvousError, TimeoutError):
    """A group did not show up in time."""


class RendezvousRefused(RendezvousError):
    """Group 0 will not take this group in, or the group was asked to stop while it waited."""


def _publish(path: Path, port: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(port)
    os.replace(tmp, path)


def _wait_for(path: Path, deadline: float, what: str, should_stop=lambda: False) -> None:
    while not path.exists():
        if should_stop():
            raise RendezvousRefused(f"{what}: asked to stop while waiting for {path}")
        if time.monotonic() > deadline:
            raise RendezvousTimeout(f"{what}: no {path} after the rendezvous' timeout")
        time.sleep(0.002)  # on the critical path of a fragment's start


def refuse(directory: str | Path) -> None:
    """Tell the groups waiting in ``directory`` that group 0 will not take them in (a grow
    that is not done in place): they raise :class:`RendezvousRefused`."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _publish(d / "port", REFUSED)


def join(
    directory: str | Path,
    group: int,
    groups: int,
    timeout: float = 60.0,
    base: MPI.Intracomm | None = None,
    should_stop=lambda: False,
) -> MPI.Intracomm:
    """The communicator of all ``groups`` groups; call on every rank of every group.

    ``base``: this group's communicator (default ``COMM_WORLD``), e.g. a running fragment's
    that takes in joiners as group 0. A group g > 0 waits for its turn at most ``timeout``
    seconds (:class:`RendezvousTimeout`), and gives up if group 0 refuses, or if
    ``should_stop()`` before group 0 has published its port (:class:`RendezvousRefused`)."""
    world = MPI.COMM_WORLD if base is None else base
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
            try:
                what = f"group {group}"
                _wait_for(port_file, deadline, what, should_stop)
                port = port_file.read_text()
                if group > 1 and port != REFUSED:  # our turn comes after the group before us
                    # Group 0 accepts by now, and would wait for this group for ever: a stop
                    # is no reason to give up any more (the grown fragment stops together).
                    _wait_for(d / f"joined.{group - 1}", deadline, what)
                    port = port_file.read_text()
            except RendezvousError as exc:
                port = exc
        port = world.bcast(port, root=0)  # every rank of the group gives up together
        if isinstance(port, RendezvousError):
            raise port
        if port == REFUSED:
            raise RendezvousRefused(f"group {group}: group 0 did not take this group in")
        comm = world.Connect(port, root=0).Merge(high=True)
        if world.rank == 0 and group < groups - 1:
            _publish(d / f"joined.{group}", "")
    for _ in range(group + 1, groups):  # accept the groups after this one, together
        comm = comm.Accept(port if comm.rank == 0 else None, root=0).Merge(high=False)
    if group == 0 and world.rank == 0:
        MPI.Close_port(port)
        port_file.unlink(missing_ok=True)
    return comm
