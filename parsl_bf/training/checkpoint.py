"""Atomic checkpoints: write to a temporary file, fsync, then rename.

A checkpoint is ``ckpt-<samples>.pt`` in its directory; a write killed half-way leaves only a
``.tmp`` file, which is never read. Loading takes the newest readable checkpoint, warning about
(and skipping) any unreadable one, so a SIGKILL loses at most the work since the previous one.
"""

from __future__ import annotations

import logging
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "CheckpointError",
    "agreed_latest",
    "checkpoints",
    "latest",
    "load",
    "load_latest",
    "rng_state",
    "save_atomically",
    "save_checkpoint",
    "set_rng_state",
]

log = logging.getLogger(__name__)
_NAME = re.compile(r"^ckpt-(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was expected."""


def checkpoints(directory: str | Path) -> list[Path]:
    """Complete checkpoints in ``directory``, newest (most samples) first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def save_checkpoint(
    directory: str | Path, state: dict[str, Any], samples: int, keep: int = 2
) -> Path:
    """Write ``state`` atomically as the checkpoint at ``samples``; keep the ``keep`` newest."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    final = save_atomically(state, d / f"ckpt-{samples:015d}.pt")
    for old in checkpoints(d)[keep:]:
        old.unlink(missing_ok=True)
    return final


def save_atomically(obj: Any, path: str | Path) -> Path:
    """``torch.save(obj)`` to a temporary file beside ``path``, fsynced, then renamed: a
    reader never sees half a file. Returns ``path``."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def agreed_latest(directory: str | Path, comm: Any) -> tuple[Path, dict[str, Any]] | None:
    """:func:`latest`, read by every rank of ``comm`` itself (in parallel: a broadcast of a
    large pickled state from rank 0 was slower); CheckpointError unless they agree."""
    found = latest(directory)
    picked = "" if found is None else found[0].name
    if comm.allgather(picked).count(picked) != comm.size:
        raise CheckpointError(f"ranks read different checkpoints in {directory}")
    return found


def rng_state() -> dict[str, Any]:
    """The torch, numpy and Python RNG states, for a checkpoint."""
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def load(path: str | Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


def latest(directory: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest readable checkpoint and its state; None if there is none at all."""
    bad = []
    for path in checkpoints(directory):
        try:
            return path, load(path)
        except Exception as exc:  # any unreadable file: truncated, foreign, corrupted
            log.warning("skipping unreadable checkpoint %s: %s", path, exc)
            bad.append(f"{path.name} ({type(exc).__name__})")
    if bad:
        raise CheckpointError(f"no readable checkpoint in {directory}: {', '.join(bad)}")
    return None


def load_latest(directory: str | Path) -> dict[str, Any] | None:
    """The newest readable checkpoint's state; None if there is none at all."""
    found = latest(directory)
    return None if found is None else found[1]
