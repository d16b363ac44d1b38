"""In-place shrink (parsl_bf.training.resize): the kept ranks train on in memory, the others
leave; real mpiexec ranks and the digits example."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from parsl_bf.training import load_latest, read_reports
from parsl_bf.training.resize import ShrinkRequest

from .fragments import result, run, until, wait_for_report

pytestmark = pytest.mark.slow


def _reports(tmp: Path) -> list[dict]:
    return read_reports(tmp / "report.jsonl")


def _params(tmp: Path) -> dict[str, torch.Tensor]:
    return load_latest(tmp / "ckpt")["model"]


def test_a_shrink_in_place_trains_on_as_an_uninterrupted_run(tmp_path: Path) -> None:
    """3 ranks to 640 samples, then rank 2 leaves and ranks 0 and 1 go on in the same
    processes: the same samples and model as 2 ranks throughout, and no restart."""
    whole, shrunk = tmp_path / "whole", tmp_path / "shrunk"
    done = run(2, whole, 2500)
    assert done.returncode == 0, done.stderr
    request = shrunk / "resize.json"
    shrunk.mkdir()
    ShrinkRequest((0, 1), of=3).write(request)
    done = run(3, shrunk, 2500, resize=request, resize_at=640)
    assert done.returncode == 0, done.stderr  # the leaver exited 0 too
    assert result(shrunk)["samples"] == 2500 and result(shrunk)["world"] == 2
    events = [(r["event"], r.get("world")) for r in _reports(shrunk)]
    assert events[0] == ("start", 3) and ("shrunk", 2) in events and events[-1] == ("done", 2)
    assert [e for e, _ in events].count("start") == 1  # the same processes throughout
    first = next(r for r in _reports(shrunk) if r["event"] == "shrunk")
    assert first["previous_world"] == 3 and first["samples"] == 640 + 64  # the step after
    a, b = _params(whole), _params(shrunk)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)


def test_a_request_shrinks_a_running_fragment_and_the_leaver_exits(tmp_path: Path, launch) -> None:
    """Two ranks, each its own mpiexec as the executor launches them: once the request is
    written, rank 1 exits while rank 0 trains on alone."""
    request = tmp_path / "resize.json"
    flags = {"rendezvous": tmp_path / "rdv", "groups": 2, "resize": request}
    ranks = [launch(tmp_path, 10**9, group=g, **flags) for g in (0, 1)]
    wait_for_report(tmp_path, "step")
    ShrinkRequest((0,), of=2).write(request)
    shrunk = wait_for_report(tmp_path, "shrunk")
    assert shrunk["world"] == 1 and shrunk["previous_world"] == 2
    assert ranks[1].wait(timeout=120) == 0, ranks[1].stderr.read()  # left, at once
    assert ranks[0].poll() is None and not request.exists()  # taken
    # A request for the old size, made again, is taken and dropped: training goes on.
    ShrinkRequest((0,), of=2).write(request)
    until(lambda: not request.exists(), timeout=120)
    last = wait_for_report(tmp_path, "step", min_samples=shrunk["samples"] + 1)
    later = wait_for_report(tmp_path, "step", min_samples=last["samples"] + 1)
    assert later["world"] == 1
    ranks[0].send_signal(signal.SIGTERM)
    assert ranks[0].wait(timeout=120) == 0, ranks[0].stderr.read()
    out = result(tmp_path)
    assert out["status"] == "stopped" and out["world"] == 1
    assert [r["event"] for r in _reports(tmp_path)].count("shrunk") == 1


def test_rank_0_may_leave_and_the_lowest_kept_rank_carries_on(tmp_path: Path) -> None:
    """3 ranks, rank 0 evaluating every 500 samples; at 640 samples ranks 1 and 2 stay: rank 1
    is rank 0 from then on, writes the reports, the checkpoints and the result, and keeps the
    evaluations made before."""
    request = tmp_path / "resize.json"
    tmp_path.mkdir(exist_ok=True)
    ShrinkRequest((1, 2), of=3).write(request)
    task = "tests.training_tasks:evaluated_digits"
    done = run(3, tmp_path, 2500, task=task, resize=request, resize_at=640)
    assert done.returncode == 0, done.stderr
    out = result(tmp_path)
    assert out["status"] == "done" and out["world"] == 2 and out["samples"] == 2500
    events = [(r["event"], r.get("world")) for r in _reports(tmp_path)]
    assert ("shrunk", 2) in events and events[-1] == ("done", 2)
    assert [e for e, _ in events].count("start") == 1
    assert [h["samples"] for h in out["metrics_history"]][:1] == [512]  # made by the old rank 0
    assert load_latest(tmp_path / "ckpt")["samples"] == 2500


def test_ranks_signalled_alone_leave_in_place_while_enough_stay(tmp_path: Path, launch) -> None:
    """A preemption signals only its own pilot's ranks. Three ranks with ``--leave-min 2``:
    rank 0 alone gets SIGTERM and leaves at its next step while ranks 1 and 2 train on in the
    same processes (the lowest is rank 0 from then on); then rank 1's SIGTERM would leave one
    rank, fewer than 2, so both checkpoint and stop."""
    flags = {"rendezvous": tmp_path / "rdv", "groups": 3, "leave_min": 2}
    ranks = [launch(tmp_path, 10**9, group=g, **flags) for g in (0, 1, 2)]
    wait_for_report(tmp_path, "step")
    ranks[0].send_signal(signal.SIGTERM)
    assert ranks[0].wait(timeout=120) == 0, ranks[0].stderr.read()
    shrunk = wait_for_report(tmp_path, "shrunk")
    assert shrunk["world"] == 2 and shrunk["previous_world"] == 3
    assert ranks[1].poll() is None and ranks[2].poll() is None
    assert not (tmp_path / "result.json").exists()  # no stop: nothing written
    after = wait_for_report(tmp_path, "step", min_samples=shrunk["samples"] + 1)
    assert after["world"] == 2
    ranks[1].send_signal(signal.SIGTERM)
    for r in ranks[1:]:
        assert r.wait(timeout=120) == 0, r.stderr.read()
    out = result(tmp_path)
    assert out["status"] == "stopped" and out["world"] == 2
    assert load_latest(tmp_path / "ckpt")["samples"] == out["samples"] >= after["samples"]
    assert [r["event"] for r in _reports(tmp_path)].count("start") == 1


def test_without_leave_min_one_signalled_rank_stops_every_rank(tmp_path: Path, launch) -> None:
    """The default: a SIGTERM to one rank of two checkpoints and stops both."""
    flags = {"rendezvous": tmp_path / "rdv", "groups": 2}
    ranks = [launch(tmp_path, 10**9, group=g, **flags) for g in (0, 1)]
    wait_for_report(tmp_path, "step")
    ranks[1].send_signal(signal.SIGTERM)
    for r in ranks:
        assert r.wait(timeout=120) == 0, r.stderr.read()
    out = result(tmp_path)
    assert out["status"] == "stopped" and out["world"] == 2
    assert "shrunk" not in [r["event"] for r in _reports(tmp_path)]
