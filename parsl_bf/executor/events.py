"""The executor's structured event log (JSON lines) and its status snapshot for ``parsl-bf
status``: what happened, and what is true now, readable while the run goes on.

Both are written best effort: a file that cannot be written (a full disk) costs its lines and
one warning, never a decision (the executor's thread writes them between its decisions)."""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Any

from .lifecycle import LogEvent

__all__ = ["EventLog", "read_status"]

log = logging.getLogger(__name__)


class EventLog:
    """Appends events to ``events``; rewrites ``status`` (atomically) with the current state."""

    def __init__(self, events: Path, status: Path) -> None:
        self.events, self.status = Path(events), Path(status)
        self.decision_s: deque[float] = deque(maxlen=10_000)  # the latest, bounded memory
        self._unwritable: set[Path] = set()  # files whose last write failed (warned once)

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"t": round(time.time(), 3), "event": event, **fields}, default=str)
        try:
            with self.events.open("a") as f:
                f.write(line + "\n")
        except OSError as exc:
            self._failed(self.events, exc)
        else:
            self._unwritable.discard(self.events)

    def decision(
        self,
        cause: str,
        seconds: float,
        actions: list[str],
        solve_s: float | None,
        causes: list[str] | None = None,
        events: int = 1,
    ) -> None:
        """One batch of events decided: ``seconds`` from the batch's first event to its
        commands sent to the pilots; ``cause`` is its first kind of event, ``causes`` all."""
        self.decision_s.append(seconds)
        self.emit(
            LogEvent.DECISION,
            cause=cause,
            causes=causes or [cause],
            events=events,
            seconds=round(seconds, 4),
            actions=actions,
            solve_s=solve_s,
        )

    def write_status(self, state: dict[str, Any]) -> None:
        d = self.decision_s
        state = state | {
            "updated": time.time(),
            "decisions": len(d),
            "decision_p50_s": statistics.median(d) if d else None,
        }
        tmp = self.status.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(state, indent=1))
            tmp.replace(self.status)
        except OSError as exc:
            self._failed(self.status, exc)
        else:
            self._unwritable.discard(self.status)

    def _failed(self, path: Path, exc: OSError) -> None:
        """One warning per file until it can be written again: a full disk, not a bug."""
        if path not in self._unwritable:
            self._unwritable.add(path)
            log.warning("%s not written (%s): dropped until a write succeeds", path, exc)


def read_status(run_dir: str | Path) -> list[dict[str, Any]]:
    """Status snapshots of every BackfillExecutor under a Parsl run directory, newest run first."""
    found = sorted(Path(run_dir).glob("**/status.json"), key=lambda p: p.stat().st_mtime)
    return [json.loads(p.read_text()) | {"path": str(p)} for p in reversed(found)]
