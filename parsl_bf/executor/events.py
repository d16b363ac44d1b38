"""The executor's structured event log (JSON lines) and its status snapshot for ``parsl-bf
status``: what happened, and what is true now, readable while the run goes on."""

from __future__ import annotations

import json
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Any

__all__ = ["EventLog", "read_status"]


class EventLog:
    """Appends events to ``events``; rewrites ``status`` (atomically) with the current state."""

    def __init__(self, events: Path, status: Path) -> None:
        self.events, self.status = Path(events), Path(status)
        self.decision_s: deque[float] = deque(maxlen=10_000)  # the latest, bounded memory

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"t": round(time.time(), 3), "event": event, **fields}, default=str)
        with self.events.open("a") as f:
            f.write(line + "\n")

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
            "decision",
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
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.status)


def read_status(run_dir: str | Path) -> list[dict[str, Any]]:
    """Status snapshots of every BackfillExecutor under a Parsl run directory, newest run first."""
    found = sorted(Path(run_dir).glob("**/status.json"), key=lambda p: p.stat().st_mtime)
    return [json.loads(p.read_text()) | {"path": str(p)} for p in reversed(found)]
