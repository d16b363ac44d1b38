"""An in-place shrink: the ranks a fragment keeps train on in memory, the others leave.

A shrink through a checkpoint (stop, save, start the smaller fragment, load) costs a save and a
load of the whole state; the ranks that stay already hold it. So the one asking (the executor,
a benchmark) writes a :class:`ShrinkRequest` beside the fragment (the worker's ``--shrink``
file) and sends every rank SIGUSR2. The ranks agree on it at the end of a step
(:class:`~parsl_bf.training.trainer.ElasticTrainer`), split off a communicator of the kept
ranks, and these take the next step at the new size; the others exit 0 with ``status``
``"left"``. Exact sample accounting and the checkpoints are unchanged: the next global step is
the same whatever the world size. The lowest rank kept is rank 0 from then on: it writes the
reports, the checkpoints and the result (rank 0's evaluation history is sent to it first).

A request that keeps no rank, names a rank that does not exist, or cannot be read is carried
out as a stop, after which the executor starts the new size from the checkpoint, as for any
rescale. No torch here: the executor imports this module.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ShrinkRequest"]


@dataclass(frozen=True)
class ShrinkRequest:
    """Keep the ranks ``keep`` of a fragment of ``of`` ranks; the others leave.

    ``of`` guards against a request that arrives late or twice: a fragment of another size
    drops it. ``of=None`` (a file that cannot be read) matches any size and keeps no rank: a
    stop."""

    keep: tuple[int, ...]
    of: int | None

    def write(self, path: Path) -> None:
        """Write the request atomically (before the signal that announces it)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"keep": list(self.keep), "of": self.of}))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path | None) -> ShrinkRequest:
        """The request in ``path``; one that keeps no rank (a stop) if there is none or it is
        not a request."""
        try:
            raw = json.loads(Path(path).read_text()) if path is not None else None
            keep, of = raw["keep"], raw["of"]
            if not all(type(r) is int for r in keep) or type(of) is not int:
                raise TypeError(f"not a shrink request: {raw!r}")
            return cls(tuple(keep), of)
        except (OSError, ValueError, TypeError, KeyError):
            return cls((), None)

    def kept(self, world: int) -> list[int] | None:
        """What a fragment of ``world`` ranks does: the ranks it keeps; [] to stop instead (not
        possible in place); None to drop the request (made for another size)."""
        if self.of is not None and self.of != world:
            return None
        keep = sorted(set(self.keep))
        if not keep or keep[0] < 0 or keep[-1] >= world:
            return []
        return keep if len(keep) < world else None  # all kept: nothing to do
