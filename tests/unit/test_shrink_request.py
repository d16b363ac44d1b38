"""What an in-place shrink request asks of a fragment (parsl_bf.training.shrink)."""

from __future__ import annotations

from pathlib import Path

import pytest

from parsl_bf.training.shrink import ShrinkRequest


@pytest.mark.parametrize(
    ("text", "world", "kept"),
    [
        ('{"keep": [0, 2], "of": 3}', 3, [0, 2]),
        ('{"keep": [0, 1], "of": 3}', 2, None),  # made for another size: dropped
        ('{"keep": [0, 1], "of": 2}', 2, None),  # keeps every rank: nothing to do
        ('{"keep": [1], "of": 2}', 2, [1]),  # rank 1 is rank 0 next
        ('{"keep": [0, 5], "of": 3}', 3, []),  # no such rank: a stop
        ('{"keep": [-1], "of": 3}', 3, []),
        ('{"keep": [], "of": 3}', 3, []),
        ('{"keep": ["0"], "of": 3}', 3, []),  # not a request: a stop
        ("not json", 3, []),
    ],
)
def test_what_a_request_asks_of_a_fragment(tmp_path: Path, text: str, world: int, kept) -> None:
    path = tmp_path / "shrink.json"
    path.write_text(text)
    assert ShrinkRequest.read(path).kept(world) == kept


def test_a_written_request_reads_back_and_a_missing_one_is_a_stop(tmp_path: Path) -> None:
    path = tmp_path / "shrink.json"
    ShrinkRequest((0, 3), of=4).write(path)
    assert ShrinkRequest.read(path) == ShrinkRequest((0, 3), of=4)
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left
    assert ShrinkRequest.read(tmp_path / "missing").kept(4) == []
    assert ShrinkRequest.read(None).kept(1) == []
