"""Processes that start often import only what they need: a pilot's agent does not pay for
torch (about 1 s of every pilot's start)."""

from __future__ import annotations

import subprocess
import sys


def test_the_pilot_agent_does_not_import_torch() -> None:
    code = "import sys, parsl_bf.executor.agent; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_pilot_agent_does_not_import_parsl() -> None:
    # Parsl's serialisation is the plain apps' warm host's to import, with its first app.
    code = "import sys, parsl_bf.executor.agent; print('parsl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
