"""The plain-app runner on a real full disk (a small tmpfs, filled; root only): the app runs,
its outcome cannot be written, and the runner says so by its exit code, which is all that
reaches the executor when stderr is on the same disk."""

from __future__ import annotations

import errno
import operator
import os
import subprocess
from pathlib import Path

from parsl.serialize import pack_apply_message

from parsl_bf.pilot import outcome as runner

from ..full_disk import fill_blocks, small_tmpfs

ROOT = Path(__file__).resolve().parents[2]


def test_an_outcome_that_cannot_be_written_exits_with_no_space(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk") as disk:
        app_in, app_out = disk / "app.in", disk / "app.out"
        app_in.write_bytes(pack_apply_message(operator.add, (2, 3), {}))
        fill_blocks(disk)
        env = os.environ | {"PYTHONPATH": str(ROOT)}
        with open(disk / "app.stdout", "ab") as out, open(disk / "app.stderr", "ab") as err:
            done = subprocess.run(
                runner.command(app_in, app_out), stdout=out, stderr=err, env=env, timeout=120
            )
        # Not 0 (nothing written), nor 1 or 120 (a traceback or a failed flush at exit).
        assert done.returncode == runner.EXIT_NO_SPACE
        assert not app_out.exists() and not list(disk.glob(".app.out.*"))  # no half file
        said = (disk / "app.stderr").read_text()  # empty: the disk took no message either
        error = runner.no_outcome_error(done.returncode, app_out, said)
        assert isinstance(error, OSError) and error.errno == errno.ENOSPC
        assert str(error) == f"[Errno 28] No space left on device: '{app_out}'"


def test_a_runner_that_was_killed_said_nothing() -> None:
    # Killed (with its pilot, or by the OOM killer): no error, the app runs again.
    assert runner.no_outcome_error(-9, "app.out", "") is None
    assert runner.no_outcome_error(0, "app.out", "") is None
    error = runner.no_outcome_error(runner.EXIT_NO_OUTCOME, "app.out", "cannot write app.out")
    assert isinstance(error, runner.RunnerError) and "cannot write app.out" in str(error)


def test_the_exit_codes_are_distinct() -> None:
    codes = [runner.EXIT_OK, runner.EXIT_BAD_INPUT, runner.EXIT_NO_OUTCOME, runner.EXIT_NO_SPACE]
    assert len(set(codes)) == 4
