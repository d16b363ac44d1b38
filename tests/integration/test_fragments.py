"""Elastic fragments with real mpiexec and real rank processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from parsl_bf.training import load_latest
from parsl_bf.training.checkpoint import checkpoints

from .fragments import (
    MPIEXEC,
    ROOT,
    env,
    rank_pids,
    result,
    run,
    start,
    wait_for_report,
    worker_args,
)

pytestmark = pytest.mark.slow


DIGITS_TRAIN, GLOBAL_BATCH = 1437, 64  # the example task's epoch and batch


def _next_step(samples: int) -> int:
    """Samples in the step after ``samples``: a batch, or less at the epoch's end."""
    return min(GLOBAL_BATCH, DIGITS_TRAIN - samples % DIGITS_TRAIN)


def _params(tmp: Path) -> dict[str, torch.Tensor]:
    return load_latest(tmp / "ckpt")["model"]


def test_rescaled_run_equals_uninterrupted_run(tmp_path: Path) -> None:
    """2 ranks throughout vs 2 → 1 → 3 → 2 with checkpoints between: same model, same samples.

    Boundaries sit on the step grid (global batch 64; the 1,437-sample epoch ends with a
    29-sample step), so both runs take exactly the same steps.
    """
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    done = run(2, whole, 2500)
    assert done.returncode == 0, done.stderr
    for world, work in ((2, 640), (1, 1437 + 128), (3, 1437 + 640), (2, 2500)):
        step = run(world, parts, work)
        assert step.returncode == 0, step.stderr
        assert result(parts)["samples"] == work and result(parts)["world"] == world
    assert result(whole)["samples"] == result(parts)["samples"] == 2500
    a, b = _params(whole), _params(parts)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)


def test_sigterm_checkpoints_and_resume_loses_nothing(tmp_path: Path) -> None:
    launcher = start(2, tmp_path, 10**6, checkpoint_every=1000)
    try:
        pids = rank_pids(launcher, 2)
        wait_for_report(tmp_path, "step", min_samples=1000)
        os.kill(pids[1], signal.SIGTERM)  # one rank only, mid-epoch
        launcher.wait(timeout=120)
    finally:
        launcher.kill()
    stopped = result(tmp_path)
    assert stopped["status"] == "stopped" and 1000 <= stopped["samples"] < 10**6
    # The stop checkpoint holds every step taken: nothing to redo.
    assert load_latest(tmp_path / "ckpt")["samples"] == stopped["samples"]
    finish = run(1, tmp_path, stopped["samples"] + 700)
    assert finish.returncode == 0, finish.stderr
    assert result(tmp_path)["status"] == "done"
    assert result(tmp_path)["samples"] == stopped["samples"] + 700


def test_sigkill_resumes_from_the_previous_checkpoint(tmp_path: Path) -> None:
    launcher = start(2, tmp_path, 10**6, checkpoint_every=10)
    try:
        pids = rank_pids(launcher, 2)
        wait_for_report(tmp_path, "step", min_samples=2000)
        os.kill(pids[0], signal.SIGKILL)
        launcher.wait(timeout=120)
    finally:
        launcher.kill()
    assert not (tmp_path / "result.json").exists()
    saved = load_latest(tmp_path / "ckpt")["samples"]
    assert saved > 0
    # What a write killed half-way leaves, and a damaged newer file: both ignored.
    (tmp_path / "ckpt" / ".ckpt-000000099999999.pt.1.tmp").write_bytes(b"partial")
    (tmp_path / "ckpt" / f"ckpt-{saved + 640:015d}.pt").write_bytes(b"\x80\x02garbage")
    finish = run(2, tmp_path, saved + 640 + 64)
    assert finish.returncode == 0, finish.stderr
    assert "skipping unreadable checkpoint" in finish.stderr
    first = wait_for_report(tmp_path, "start", min_samples=saved)
    assert first["samples"] == saved + _next_step(saved)  # the good checkpoint, one step on
    assert result(tmp_path)["samples"] == saved + 640 + 64


def test_ranks_of_separate_launchers_form_one_fragment(tmp_path: Path) -> None:
    """One mpiexec with 1 rank and another with 2 ranks: a world of 3, via Open_port/Connect."""
    common = {"rendezvous": tmp_path / "rdv", "groups": 2}
    first = subprocess.Popen(
        [MPIEXEC, "-n", "1", *worker_args(tmp_path, 1500, group=0, **common)],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    second = subprocess.run(
        [MPIEXEC, "-n", "2", *worker_args(tmp_path, 1500, group=1, **common)],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.wait(timeout=120) == 0, first.stderr.read()
    assert second.returncode == 0, second.stderr
    out = result(tmp_path)
    assert out["world"] == 3 and out["samples"] == 1500 and out["status"] == "done"


@pytest.mark.parametrize(
    ("n", "args", "message"),
    [
        (
            2,
            {"task": "tests.training_tasks:rank_dependent_model"},
            "parameters differ across ranks",
        ),
        (3, {"options": '{"global_batch": 2}'}, "exceeds the samples per step"),
        (1, {"task": "no.such.module:task"}, "No module named"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path: Path, n: int, args: dict, message: str) -> None:
    proc = run(n, tmp_path, 1000, **args)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_unreadable_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "ckpt-000000000000640.pt").write_text("not a checkpoint")
    proc = run(1, tmp_path, 1000)
    assert proc.returncode != 0
    assert "no readable checkpoint" in proc.stderr and "ckpt-000000000000640.pt" in proc.stderr
    assert checkpoints(tmp_path / "ckpt")  # nothing was deleted


class _Payload:
    """Unpickled, it creates ``marker``: a stand-in for any code a pickle can run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_damaged_and_malicious_newer_checkpoints_are_skipped(tmp_path: Path) -> None:
    """Newer than the valid checkpoint: one with flipped bytes in its weights, one a pickle
    that would run code. Both ranks skip both and resume from the valid one; nothing runs."""
    first = run(1, tmp_path, 640)
    assert first.returncode == 0, first.stderr
    (good,) = checkpoints(tmp_path / "ckpt")
    state = load_latest(tmp_path / "ckpt")
    data = bytearray(good.read_bytes())
    at = data.find(state["model"]["head.weight"].numpy().tobytes()[:64])
    assert at > 0
    data[at + 9] ^= 0x10
    (tmp_path / "ckpt" / f"ckpt-{1280:015d}.pt").write_bytes(bytes(data))
    marker = tmp_path / "MARKER"
    evil = {"model": _Payload(marker), "samples": 1920}
    torch.save(evil, tmp_path / "ckpt" / f"ckpt-{1920:015d}.pt")
    finish = run(2, tmp_path, 640 + 640)
    assert finish.returncode == 0, finish.stderr
    assert "checksum mismatch" in finish.stderr and not marker.exists()
    resumed = wait_for_report(tmp_path, "start", min_samples=641)
    assert resumed["samples"] == 640 + _next_step(640) and resumed["world"] == 2
    assert result(tmp_path)["samples"] == 1280


def test_a_foreign_newest_checkpoint_falls_back_to_the_older_one(tmp_path: Path) -> None:
    """Another model's checkpoint, newest in the directory: skipped on every rank (no MPI
    abort in load_state_dict), and the run resumes from the valid older one. The trainer
    passes ``check=`` (checkpoint.mismatch) to agreed_latest for this."""
    from parsl_bf.training.checkpoint import rng_state, save_checkpoint

    first = run(1, tmp_path, 640)
    assert first.returncode == 0, first.stderr
    other = torch.nn.Linear(64, 10)
    foreign = {
        "model": other.state_dict(),
        "optimizer": torch.optim.SGD(other.parameters(), lr=0.1).state_dict(),
        "samples": 1280,
        "steps": 20,
        "rng": rng_state(),
    }
    save_checkpoint(tmp_path / "ckpt", foreign, 1280)
    finish = run(2, tmp_path, 640 + 640)
    assert finish.returncode == 0, "does the trainer pass check= to agreed_latest?\n" + (
        finish.stderr
    )
    assert "which does not fit: model: keys:" in finish.stderr
    resumed = wait_for_report(tmp_path, "start", min_samples=641)
    assert resumed["samples"] == 640 + _next_step(640)
    assert result(tmp_path)["samples"] == 1280


def _successor(tmp: Path, work: int, **flags) -> subprocess.Popen:
    """One warm rank that takes over from the run writing ``result.json`` in ``tmp``."""
    args = worker_args(tmp, work, after=tmp / "result.json", ready=tmp / "ready", **flags)
    args[args.index("--result") + 1] = str(tmp / "result-new.json")
    return subprocess.Popen(
        [MPIEXEC, "-n", "1", *args],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_ready(tmp: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not (tmp / "ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)


def test_warm_start_waits_for_the_previous_run(tmp_path: Path) -> None:
    """The next size starts before the old run stops, and resumes from the stop checkpoint."""
    old = start(2, tmp_path, 10**6, checkpoint_every=1000)
    try:
        pids = rank_pids(old, 2)
        wait_for_report(tmp_path, "step", min_samples=640)
        new = _successor(tmp_path, 10**6)
        _wait_ready(tmp_path, new)  # the standby is set up, waiting
        assert not (tmp_path / "result-new.json").exists()
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
        assert old.wait(timeout=120) == 0
        stopped = result(tmp_path)["samples"]
        resumed = wait_for_report(tmp_path, "start", min_samples=stopped + 1)
        assert resumed["samples"] == stopped + _next_step(stopped) and resumed["world"] == 1
        for pid in rank_pids(new, 1):
            os.kill(pid, signal.SIGTERM)
        assert new.wait(timeout=120) == 0, new.stderr.read()
    finally:
        old.kill()


def test_a_standby_asked_to_stop_exits_without_training(tmp_path: Path) -> None:
    """Its predecessor never hands over (e.g. a preemption): a signal to one rank stops all."""
    new = start(2, tmp_path, 10**6, after=tmp_path / "never.json", ready=tmp_path / "ready")
    try:
        pids = rank_pids(new, 2)
        deadline = time.monotonic() + 120
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline and new.poll() is None
            time.sleep(0.1)
        os.kill(pids[1], signal.SIGTERM)  # one rank only: they decide together
        assert new.wait(timeout=60) == 0, new.stderr.read()
        assert result(tmp_path)["status"] == "stopped" and result(tmp_path)["samples"] == 0
        assert not checkpoints(tmp_path / "ckpt")
    finally:
        new.kill()


def _handover_run(tmp: Path, how: str) -> tuple[dict, dict]:
    """A 1-rank successor set up and waiting (``--handover how``) before a 2-rank run stops
    itself at 640 samples; the successor's start report and its result at 1,280."""
    new = _successor(tmp, 1280, handover=how)
    try:
        _wait_ready(tmp, new)  # listening (peer), and waiting for the file
        old = run(2, tmp, 10**6, stop_at=640, checkpoint_every=1000)
        assert old.returncode == 0, old.stderr
        assert result(tmp)["status"] == "stopped" and result(tmp)["samples"] == 640
        assert new.wait(timeout=120) == 0, new.stderr.read()
    finally:
        new.kill()
    resumed = wait_for_report(tmp, "start", min_samples=641)
    return resumed, json.loads((tmp / "result-new.json").read_text())


def test_a_warm_successor_takes_the_state_sent_as_it_would_the_file(tmp_path: Path) -> None:
    """The stopping ranks send their state to the listening successor, which trains on from
    it exactly as from the checkpoint file: same samples, the same model at the end."""
    peer, file = tmp_path / "peer", tmp_path / "file"
    peer_start, peer_result = _handover_run(peer, "peer")
    file_start, file_result = _handover_run(file, "file")
    assert peer_start["from_peer"] is True and file_start["from_peer"] is False
    assert peer_start["samples"] == file_start["samples"] == 640 + _next_step(640)
    assert peer_result["status"] == file_result["status"] == "done"
    assert peer_result["samples"] == file_result["samples"] == 1280
    a, b = _params(peer), _params(file)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not list((peer / "ckpt" / ".handover").glob("*.json"))  # the listener is gone
