"""In-place grow (parsl_bf.training.resize): joiner ranks connect to a running fragment and get
its state by broadcast; real mpiexec ranks and the digits example."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from parsl_bf.training import load_latest, read_reports
from parsl_bf.training.resize import GrowRequest, ready_file

from .fragments import result, run, until

pytestmark = pytest.mark.slow


def _reports(tmp: Path) -> list[dict]:
    """The complete report lines so far (one being written is left for the next look)."""
    return read_reports(tmp / "report.jsonl")


def test_a_grow_in_place_trains_on_as_an_uninterrupted_run(tmp_path: Path, launch) -> None:
    """2 ranks to 640 samples, then a third joins and gets the state from rank 0: the same
    samples and model as 3 ranks throughout, with no restart and no checkpoint read."""
    whole, grown = tmp_path / "whole", tmp_path / "grown"
    done = run(3, whole, 2500)
    assert done.returncode == 0, done.stderr
    grown.mkdir()
    rdv, request = grown / "rdv", grown / "resize.json"
    joiner = launch(grown, 2500, join=rdv, group=1, groups=2, resize=request)
    until(lambda: ready_file(rdv, 1).exists())  # set up, before the request is written
    GrowRequest(str(rdv), groups=2, of=2, to=3).write(request)
    done = run(2, grown, 2500, resize=request, resize_at=640)
    assert done.returncode == 0, done.stderr
    assert joiner.wait(timeout=300) == 0, joiner.stderr.read()
    out = result(grown)
    assert out["status"] == "done" and out["samples"] == 2500 and out["world"] == 3
    events = [(r["event"], r.get("world")) for r in _reports(grown)]
    assert events[0] == ("start", 2) and ("grown", 3) in events and events[-1] == ("done", 3)
    assert [e for e, _ in events].count("start") == 1  # the same processes throughout
    first = next(r for r in _reports(grown) if r["event"] == "grown")
    assert first["previous_world"] == 2 and first["samples"] == 640 + 64  # the step after
    a, b = load_latest(whole / "ckpt")["model"], load_latest(grown / "ckpt")["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)


def test_a_running_fragment_grows_twice_while_it_trains(tmp_path: Path, launch) -> None:
    """1 rank grows to 2, then to 3, on requests written while it trains: at the second grow
    the rank that joined at the first is a running rank like rank 0. Then a stop: every rank
    checkpoints and exits 0, and the result is rank 0's."""
    request = tmp_path / "resize.json"
    fragment = launch(tmp_path, 10**9, resize=request)
    joiners = []
    for world in (1, 2):
        rdv = tmp_path / f"grow{world}"
        joiners.append(launch(tmp_path, 10**9, join=rdv, group=1, groups=2, resize=request))
        until(lambda rdv=rdv: ready_file(rdv, 1).exists())
        GrowRequest(str(rdv), groups=2, of=world, to=world + 1).write(request)
        until(lambda world=world: any(
            r["event"] == "grown" and r["world"] == world + 1 for r in _reports(tmp_path)
        ))  # fmt: skip
    grown = max(r["samples"] for r in _reports(tmp_path))
    until(lambda: any(
        r["event"] == "step" and r["world"] == 3 and r["samples"] > grown
        for r in _reports(tmp_path)
    ))  # fmt: skip
    fragment.send_signal(signal.SIGTERM)  # the ranks agree on it in the next step
    for proc in (fragment, *joiners):
        assert proc.wait(timeout=300) == 0, proc.stderr.read()
    out = result(tmp_path)
    assert out["status"] == "stopped" and out["world"] == 3
    events = [r["event"] for r in _reports(tmp_path)]
    assert events.count("start") == 1 and events.count("grown") == 2


def test_a_grow_that_cannot_be_done_in_place_stops_and_its_joiner_leaves(
    tmp_path: Path, launch
) -> None:
    """A grow to more ranks than a step has samples: the fragment checkpoints and stops (the
    executor then starts the new size from the checkpoint); the joiner is told, and exits 0
    without training."""
    rdv, request = tmp_path / "rdv", tmp_path / "resize.json"
    joiner = launch(tmp_path, 2500, join=rdv, group=1, groups=2)
    until(lambda: ready_file(rdv, 1).exists())
    GrowRequest(str(rdv), groups=2, of=1, to=65).write(request)  # 64 samples a step
    done = run(1, tmp_path, 2500, resize=request, resize_at=320)
    assert done.returncode == 0, done.stderr
    assert joiner.wait(timeout=300) == 0, joiner.stderr.read()
    out = result(tmp_path)
    assert out["status"] == "stopped" and out["world"] == 1 and out["samples"] == 320
    assert [r["event"] for r in _reports(tmp_path)].count("start") == 1  # the joiner never did


def test_a_fragment_that_ends_before_the_grow_lets_its_joiner_go(tmp_path: Path, launch) -> None:
    """A grow asked of a fragment that finishes its work first (it looks for the request only
    past its end): the fragment ends done, and the joiner waiting at the rendezvous is told
    and exits 0."""
    rdv, request = tmp_path / "rdv", tmp_path / "resize.json"
    joiner = launch(tmp_path, 640, join=rdv, group=1, groups=2)
    until(lambda: ready_file(rdv, 1).exists())
    GrowRequest(str(rdv), groups=2, of=1, to=2).write(request)
    done = run(1, tmp_path, 640, resize=request, resize_at=10**9)
    assert done.returncode == 0, done.stderr
    assert joiner.wait(timeout=300) == 0, joiner.stderr.read()
    assert result(tmp_path)["status"] == "done" and not request.exists()  # taken, refused
