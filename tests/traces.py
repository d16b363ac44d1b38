"""Small hand-written idle traces for the replay's tests."""

from __future__ import annotations

import numpy as np

from parsl_bf.inputs.trace import IdleTrace


def idle_trace(initial, changes, end_s) -> IdleTrace:
    """Nodes ``n0..`` idle as ``initial`` says at 0 s, then ``changes``: (t, node, idle)."""
    t, node, idle = zip(*changes, strict=True) if changes else ((), (), ())
    return IdleTrace(
        tuple(f"n{i}" for i in range(len(initial))),
        np.array(initial, dtype=bool),
        np.array(t, dtype=np.int64),
        np.array(node, dtype=np.int64),
        np.array(idle, dtype=bool),
        end_s,
    )
