"""Two sessions that bring up a loopback Slurm cluster on the same ports take turns: the second
waits for the first's lock instead of breaking its cluster. No Slurm needed: only the lock."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from ..integration.slurm import ports_lock

PORT = 16999
HOLDER = """
import sys, time
from pathlib import Path
from tests.integration.slurm import ports_lock
with ports_lock({port}):
    Path(sys.argv[1], "held").touch()
    while not Path(sys.argv[1], "release").exists():
        time.sleep(0.05)
"""


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    while not path.exists():
        assert proc.poll() is None, "the first session ended before it took the lock"
        threading.Event().wait(0.05)


def test_a_second_session_waits_for_the_first(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the lock file lives here, apart from real ones
    root = Path(__file__).resolve().parents[2]
    first = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(port=PORT), str(tmp_path)], cwd=root
    )
    try:
        _wait_for(tmp_path / "held", first)
        acquired = threading.Event()

        def second() -> None:
            with ports_lock(PORT):
                acquired.set()

        thread = threading.Thread(target=second, daemon=True)
        thread.start()
        # It found the lock taken (the message is printed only then), and it is still waiting.
        while "waiting for another session's cluster" not in capsys.readouterr().out:
            assert thread.is_alive()
            threading.Event().wait(0.05)
        assert not acquired.is_set()
        (tmp_path / "release").touch()
        assert first.wait(timeout=300) == 0
        thread.join(timeout=300)
        assert acquired.is_set()
    finally:
        (tmp_path / "release").touch()
        first.wait(timeout=300)
    # Once free, the lock is taken at once.
    with ports_lock(PORT):
        pass
    assert "waiting" not in capsys.readouterr().out
