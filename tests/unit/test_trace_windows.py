"""The choice of a trace window (``parsl_bf.replay.windows``) on a hand-made trace, against the
window worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from parsl_bf.inputs.trace import IdleTrace
from parsl_bf.replay.windows import Window, choose_window, idle_intervals

# Node 0 idle throughout; node 1 idle 200-260, 280-290, 600-650, 670-700; node 2 idle 610-640
# and from 660 to the trace's end.
CHANGES = [
    (200, 1, True),
    (260, 1, False),
    (280, 1, True),
    (290, 1, False),
    (600, 1, True),
    (610, 2, True),
    (640, 2, False),
    (650, 1, False),
    (660, 2, True),
    (670, 1, True),
    (700, 1, False),
]
TRACE = IdleTrace(
    ("n0", "n1", "n2"),
    np.array([True, False, False]),
    np.array([t for t, _, _ in CHANGES], dtype=np.int64),
    np.array([n for _, n, _ in CHANGES], dtype=np.int64),
    np.array([i for _, _, i in CHANGES], dtype=bool),
    1000,
)


def test_idle_intervals_per_node() -> None:
    got = [x.tolist() for x in idle_intervals(TRACE)]
    assert got == [
        [[0, 1000]],
        [[200, 260], [280, 290], [600, 650], [670, 700]],
        [[610, 640], [660, 1000]],
    ]


def test_the_busiest_window_with_long_enough_pieces() -> None:
    # 100 trace s in 10 wall s: pieces of 2 wall s are 20 trace s. Nodes 0-1 have at most 3
    # change times in a window whose pieces all last that long (599-699); nodes 1-2 have 6 in
    # 599-699 and in 609-709, where they are more idle (150 node-s against 148).
    w = choose_window(TRACE, nodes=2, duration_s=10, min_hole_s=2, lengths=[100])
    assert w == Window(
        node_offset=1,
        nodes=2,
        start_s=609,
        length_s=100,
        duration_s=10,
        changes=6,
        pieces=(((609, 650), (670, 700)), ((610, 640), (660, 709))),
    )
    assert (w.time_scale, w.end_s, w.idle_node_s, w.wall(659)) == (10, 709, 15, 5)
    assert w.holes_wall() == pytest.approx([4.1, 3.0, 3.0, 4.9])
    assert w.describe(("n1", "n2")) == "  n1: idle 0-4, 6-9 s\n  n2: idle 0-3, 5-10 s"


def test_a_piece_too_short_or_too_little_idle_rules_a_window_out() -> None:
    # Of nodes 0-1, a window over node 1's 10 s piece at 280 (or one starting a second before
    # a piece ends) is out: only 599-699 (3 change times) and 669-769 (2) are left.
    w = choose_window(IdleTrace(*_first(2)), nodes=2, duration_s=10, min_hole_s=2, lengths=[100])
    assert (w.node_offset, w.start_s, w.changes) == (0, 599, 3)
    # At most 179 of 200 node-s idle (nodes 0-1 from 599).
    with pytest.raises(ValueError, match="no window of 2 nodes"):
        choose_window(TRACE, nodes=2, duration_s=10, min_hole_s=2, lengths=[100], min_idle=0.9)
    with pytest.raises(ValueError, match="no window of 2 nodes"):
        choose_window(TRACE, nodes=2, duration_s=10, min_hole_s=10, lengths=[100])


def _first(n: int) -> tuple:
    """TRACE's fields restricted to its first ``n`` nodes."""
    keep = TRACE.change_node < n
    return (
        TRACE.nodes[:n],
        TRACE.initial[:n],
        TRACE.change_t[keep],
        TRACE.change_node[keep],
        TRACE.change_idle[keep],
        TRACE.end_s,
    )
