"""Resizing a running fragment in place: no stop, no checkpoint round trip, no restart.

A rescale through a checkpoint (stop, save, start the new size, load) costs a save and a load
of the whole state, and a start of every rank. The ranks that stay already hold the state. So
the one asking (the executor, a benchmark) writes a request into the fragment's resize file
(the worker's ``--resize``), which its ranks look for at the end of a step; they agree on it
in the step's Allreduce (:class:`~parsl_bf.training.trainer.ElasticTrainer`).

- A :class:`ShrinkRequest` names the ranks to keep. These split off a communicator of their
  own and take the next step at the new size; the others exit 0 with ``status`` ``"left"``.
  The lowest rank kept is rank 0 from then on: it writes the reports, the checkpoints and the
  result (rank 0's evaluation history is sent to it first).
- A :class:`GrowRequest` names a rendezvous directory and the number of joiner groups (each
  one launch: a ``mpiexec`` on a new node, or a warm rank), which were started with
  ``--rendezvous DIR --group g --groups G --join`` (g = 1..G-1) and are set up (model and
  optimizer built) before the request is written. The fragment is group 0: its rank 0 opens
  an MPI port there, the groups connect in turn (:func:`~parsl_bf.training.rendezvous.join`),
  and the joiners receive the whole state (model, optimizer, scheduler, data position, RNG,
  history) by a broadcast from rank 0, then every rank takes the next step at the new size.

Exact sample accounting and the checkpoints are unchanged either way: the next global step is
the same whatever the world size. A request that cannot be done in place (it keeps no rank,
names a rank that does not exist, asks for more ranks than a step has samples, cannot be read)
is carried out as a stop, after which the executor starts the new size from the checkpoint, as
for any rescale; one made for another world size (late, or repeated) is dropped. Joiners of a
grow that is not done are told so (:func:`~parsl_bf.training.rendezvous.refuse`) and leave. No torch
here: the executor imports this module.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GrowRequest", "ShrinkRequest", "read_request", "ready_file"]


def ready_file(rendezvous: str | Path, group: int) -> Path:
    """The file a joiner group creates once it is set up (model and optimizer built): the grow
    request is written once every joiner's is there, so the fragment never waits for one."""
    return Path(rendezvous) / f"ready.{group}"


def _write(path: Path, record: dict) -> None:
    """Write a request atomically: the ranks never see half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


@dataclass(frozen=True)
class ShrinkRequest:
    """Keep the ranks ``keep`` of a fragment of ``of`` ranks; the others leave.

    ``of`` guards against a request that arrives late or twice: a fragment of another size
    drops it. ``of=None`` (a file that cannot be read) matches any size and keeps no rank: a
    stop."""

    keep: tuple[int, ...]
    of: int | None

    def write(self, path: Path) -> None:
        """Write the request atomically (the ranks look for it at the end of a step)."""
        _write(path, {"keep": list(self.keep), "of": self.of})

    def kept(self, world: int) -> list[int] | None:
        """What a fragment of ``world`` ranks does: the ranks it keeps; [] to stop instead (not
        possible in place); None to drop the request (made for another size)."""
        if self.of is not None and self.of != world:
            return None
        keep = sorted(set(self.keep))
        if not keep or keep[0] < 0 or keep[-1] >= world:
            return []
        return keep if len(keep) < world else None  # all kept: nothing to do


@dataclass(frozen=True)
class GrowRequest:
    """Take in the joiner groups 1..``groups``-1 of ``rendezvous``: a fragment of ``of`` ranks
    becomes one of ``to`` ranks."""

    rendezvous: str
    groups: int
    of: int
    to: int

    def write(self, path: Path) -> None:
        """Write the request atomically, once every joiner is set up."""
        grow = {"rendezvous": self.rendezvous, "groups": self.groups, "to": self.to}
        _write(path, {"grow": grow, "of": self.of})

    def joiners_ready(self) -> bool:
        """Every joiner group (1..groups-1) has said it is set up."""
        return all(ready_file(self.rendezvous, g).exists() for g in range(1, self.groups))

    def action(self, world: int, most: int) -> str:
        """What a fragment of ``world`` ranks, whose steps have ``most`` samples, does:
        ``"grow"``; ``"stop"`` (not possible in place); ``"drop"`` (made for another size)."""
        if self.of != world:
            return "drop"
        return "grow" if self.groups >= 2 and world < self.to <= most else "stop"


def read_request(path: Path | None) -> ShrinkRequest | GrowRequest:
    """The request in ``path``; a shrink that keeps no rank (a stop) if there is none or it is
    not a request."""
    try:
        raw = json.loads(Path(path).read_text()) if path is not None else None
        if isinstance(raw, dict) and isinstance(raw.get("grow"), dict):
            grow, of = raw["grow"], raw["of"]
            rendezvous, groups, to = grow["rendezvous"], grow["groups"], grow["to"]
            if type(rendezvous) is not str or not all(type(v) is int for v in (groups, of, to)):
                raise TypeError(f"not a grow request: {raw!r}")
            return GrowRequest(rendezvous, groups, of, to)
        keep, of = raw["keep"], raw["of"]
        if not all(type(r) is int for r in keep) or type(of) is not int:
            raise TypeError(f"not a shrink request: {raw!r}")
        return ShrinkRequest(tuple(keep), of)
    except (OSError, ValueError, TypeError, KeyError):
        return ShrinkRequest((), None)
