"""BackfillExecutor on a real full disk: its task directories (and checkpoints) on a small
tmpfs (root only: mounted here, unmounted after), real pilots of the local emulation, no
preemption (nodes idle for an hour). A full disk fails the futures; it never hangs them."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from parsl_bf.executor import BackfillExecutor, FragmentFailed
from parsl_bf.providers import LocalBackfillProvider
from parsl_bf.training.reports import read_reports

from ..full_disk import fill_inodes, small_tmpfs
from .htex import ROOT

pytestmark = pytest.mark.slow
# A bound on a hang, not a speed: a pilot starts in seconds.
SETTLE_S = 300


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs with room for 64 files and directories."""
    with small_tmpfs(tmp_path / "disk", size="1m", nr_inodes=64) as mounted:
        yield mounted


@pytest.fixture
def dfk(tmp_path: Path, disk: Path, monkeypatch) -> Iterator[BackfillExecutor]:
    """A loaded DFK whose BackfillExecutor keeps its task directories and checkpoints on the
    small tmpfs (its event log, status and pilots' scripts stay on the real disk)."""
    import parsl
    from parsl.config import Config

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    provider = LocalBackfillProvider(
        nodes=2, time_scale=1, idle_s=3600, busy_s=1, max_nodes=1, max_blocks=2
    )
    executor = BackfillExecutor(
        label="bf",
        provider=provider,
        checkpoint_dir=str(disk / "checkpoints"),
        max_restarts=1,
        warm_ranks=False,  # no standby ranks to start: what fails here is the launch
        heartbeat_timeout_s=10,
    )
    config = Config(executors=[executor], strategy_period=1, run_dir=str(tmp_path / "runinfo"))
    with parsl.load(config):
        (Path(executor.directory) / "tasks").symlink_to(disk, target_is_directory=True)
        yield executor


def _error(future: Future, executor: BackfillExecutor) -> BaseException:
    """The future's exception, waited for up to SETTLE_S; a hang fails with where each task
    stands and the executor's last events."""
    try:
        error = future.exception(timeout=SETTLE_S)
    except TimeoutError:
        c = executor.controller
        tasks = [f"{t.id} {t.state} restarts={t.restarts}" for t in c.elastic.values()]
        tasks += [f"{t.id} {t.state} attempts={t.attempts}" for t in c.plain.values()]
        events = read_reports(Path(executor.directory) / "events.jsonl")[-10:]
        raise AssertionError(
            f"not settled in {SETTLE_S} s: {'; '.join(tasks)}; pilots {sorted(c.pilots)}; "
            f"last events {[e['event'] for e in events]}"
        ) from None
    assert error is not None, f"resolved with {future.result()!r}"
    return error


def _fill(path: str) -> str:
    """A plain app that fills its disk (as apps do), then returns."""
    with open(path, "ab", buffering=0) as f:
        while True:
            try:
                f.write(b"\0" * 65536)
            except OSError:
                return "filled"


def test_a_plain_app_whose_outcome_cannot_be_written_fails_with_the_disk_error(
    dfk: BackfillExecutor, disk: Path
) -> None:
    from parsl.app.app import python_app

    fill = python_app(_fill, executors=["bf"])
    error = _error(fill(str(disk / "filler")), dfk)
    # The app ran (the disk is full), its runner could not write app.out: that error, not a
    # requeue as if it had been killed, which would run it again as long as the disk is full.
    assert (disk / "filler").stat().st_size > 0
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC, repr(error)
    assert str(error).endswith("app.out'") and "tasks/t1/" in str(error)
    assert dfk.controller.plain["t1"].attempts == 1


def test_a_fragment_whose_files_cannot_be_created_fails_after_max_restarts(
    dfk: BackfillExecutor, disk: Path
) -> None:
    from parsl_bf.executor import elastic_app

    # Room for the task's directory (made at submission) and nothing more: its fragment's
    # directory cannot be made, in the executor, at each start.
    fill_inodes(disk, leave=1)
    train = elastic_app("parsl_bf.training.examples:digits_cnn", work=640, name="full")
    error = _error(train(lr=0.05, width=8), dfk)
    assert isinstance(error, FragmentFailed), repr(error)
    assert "after 1 restarts" in str(error)
    assert "its launch failed: OSError: [Errno 28] No space left on device" in str(error)
    task = dfk.controller.elastic["t1"]
    assert task.restarts == 1 and task.state == "failed" and task.generation == 2
    events = read_reports(Path(dfk.directory) / "events.jsonl")
    failed = [e for e in events if e["event"] == "command_failed"]
    assert [e["command"] for e in failed] == [
        "StartFragment of task t1 fragment 1",
        "StartFragment of task t1 fragment 2",
    ]
