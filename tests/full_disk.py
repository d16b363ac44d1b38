"""A real full disk for tests: a small tmpfs mounted on a directory, filled, unmounted after.

Mounting needs root (CI runs as root); elsewhere the tests that use it skip, saying why.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(directory: Path, size: str = "1m", nr_inodes: int | None = None) -> Iterator[Path]:
    """``directory`` as a fresh tmpfs of ``size`` (and at most ``nr_inodes`` files and
    directories), unmounted on the way out whatever happened."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs mounted, which needs root")
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("no mount/umount on this machine")
    directory.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (f",nr_inodes={nr_inodes}" if nr_inodes else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs on {directory}: {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        # Lazily if something still has a file open there (a process the test left).
        if subprocess.run(["umount", str(directory)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(directory)], check=True)


def fill_blocks(directory: Path) -> None:
    """Write to ``directory`` until its file system has no space left."""
    with open(directory / "filler", "ab", buffering=0) as f:  # each write says what it did
        while True:
            try:
                f.write(b"\0" * 65536)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                return


def fill_inodes(directory: Path, leave: int = 0) -> None:
    """Create empty files in ``directory`` until its file system can hold no more, then
    remove ``leave`` of them: room for exactly that many new files or directories."""
    made: list[Path] = []
    try:
        while True:
            path = directory / f"inode{len(made)}"
            path.touch()
            made.append(path)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    for path in made[len(made) - leave :] if leave else ():
        path.unlink()
