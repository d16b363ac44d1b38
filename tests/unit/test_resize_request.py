"""What an in-place resize request asks of a fragment (parsl_bf.training.resize)."""

from __future__ import annotations

from pathlib import Path

import pytest

from parsl_bf.training.resize import GrowRequest, ShrinkRequest, read_request


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
    path = tmp_path / "resize.json"
    path.write_text(text)
    assert read_request(path).kept(world) == kept


def test_a_written_request_reads_back_and_a_missing_one_is_a_stop(tmp_path: Path) -> None:
    path = tmp_path / "resize.json"
    ShrinkRequest((0, 3), of=4).write(path)
    assert read_request(path) == ShrinkRequest((0, 3), of=4)
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left
    assert read_request(tmp_path / "missing").kept(4) == []
    assert read_request(None).kept(1) == []


def test_the_controller_numbers_a_second_shrink_as_the_ranks_are_then() -> None:
    from parsl_bf.executor.controller import renumbered

    # Three launchers of 2, 1 and 2 ranks (a pilot with two GPUs, say): the middle one leaves.
    ranges = {0: (0, 2), 1: (2, 1), 2: (3, 2)}
    ranks, of, after = renumbered(ranges, (0, 2))
    assert (ranks, of) == ((0, 1, 3, 4), 5)
    assert after == {0: (0, 2), 2: (2, 2)}
    # Then the first leaves: the ranks of launcher 2 are 2 and 3 of a world of 4 by now.
    ranks, of, after = renumbered(after, (2,))
    assert (ranks, of) == ((2, 3), 4) and after == {2: (0, 2)}
    assert ShrinkRequest(ranks, of).kept(4) == [2, 3]


@pytest.mark.parametrize(
    ("text", "world", "action"),
    [
        ('{"grow": {"rendezvous": "r", "groups": 3, "to": 4}, "of": 2}', 2, "grow"),
        ('{"grow": {"rendezvous": "r", "groups": 3, "to": 4}, "of": 2}', 3, "drop"),  # late
        ('{"grow": {"rendezvous": "r", "groups": 3, "to": 99}, "of": 2}', 2, "stop"),  # too big
        ('{"grow": {"rendezvous": "r", "groups": 1, "to": 4}, "of": 2}', 2, "stop"),  # no joiner
        ('{"grow": {"rendezvous": "r", "groups": 3, "to": 2}, "of": 2}', 2, "stop"),  # no larger
    ],
)
def test_what_a_grow_request_asks_of_a_fragment(
    tmp_path: Path, text: str, world: int, action: str
) -> None:
    path = tmp_path / "resize.json"
    path.write_text(text)
    request = read_request(path)
    assert isinstance(request, GrowRequest)
    assert request.action(world, most=64) == action


@pytest.mark.parametrize(
    "text",
    [
        '{"grow": {"rendezvous": 1, "groups": 3, "to": 4}, "of": 2}',
        '{"grow": {"rendezvous": "r", "groups": "3", "to": 4}, "of": 2}',
        '{"grow": {"rendezvous": "r", "groups": 3}, "of": 2}',
        '{"grow": {"rendezvous": "r", "groups": 3, "to": 4}}',
        "[]",
    ],
)
def test_a_malformed_grow_request_is_a_stop(tmp_path: Path, text: str) -> None:
    path = tmp_path / "resize.json"
    path.write_text(text)
    assert read_request(path) == ShrinkRequest((), None)


def test_a_written_grow_request_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "resize.json"
    GrowRequest(str(tmp_path / "rdv"), groups=3, of=2, to=4).write(path)
    assert read_request(path) == GrowRequest(str(tmp_path / "rdv"), 3, 2, 4)
    assert list(tmp_path.iterdir()) == [path]
