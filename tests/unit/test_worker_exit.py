"""A rank ends without the interpreter's teardown (parsl_bf.training.worker.exit_now), and
still leaves what the teardown would have: open files flushed, atexit handlers run, stdio."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RANK = textwrap.dedent(
    """
    import atexit, sys
    from parsl_bf.training.worker import exit_now

    log = open(sys.argv[1], "w")  # a task's own file, never closed
    log.write("trained")
    atexit.register(lambda: open(sys.argv[2], "w").write("handler ran"))
    print("to stdout", end="")
    print("to stderr", end="", file=sys.stderr)
    exit_now(3)
    """
)


def test_exit_now_flushes_files_runs_atexit_and_keeps_the_code(tmp_path: Path) -> None:
    log, mark = tmp_path / "log.txt", tmp_path / "mark.txt"
    proc = subprocess.run(
        [sys.executable, "-c", RANK, str(log), str(mark)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    assert log.read_text() == "trained"
    assert mark.read_text() == "handler ran"
    assert proc.stdout == "to stdout"
    assert proc.stderr.endswith("to stderr")


def test_a_usage_error_still_exits_2_with_its_message(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "parsl_bf.training.worker", "--work", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "usage:" in proc.stderr and "--work" in proc.stderr


def test_a_dead_peer_or_no_memory_is_not_the_tasks_failure() -> None:
    # A rank whose peer was SIGKILLed may hear of it from MPICH (an MPI error raised in the
    # step's Allreduce) before mpiexec kills it: that fragment resumes from its checkpoint,
    # it must not report the task's own error (which fails the task at once).
    from mpi4py import MPI

    from parsl_bf.training.worker import infrastructure_failure

    assert infrastructure_failure(MPI.Exception(MPI.ERR_OTHER))
    assert infrastructure_failure(MemoryError())
    assert not infrastructure_failure(ValueError("the task's own bug"))
    assert not infrastructure_failure(ZeroDivisionError())
