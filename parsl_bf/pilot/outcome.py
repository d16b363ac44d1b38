"""The plain-app runner's contract, defined once for the executor, the agent and the runner
(:mod:`parsl_bf.pilot.runner`): its command line, its outcome file and its exit codes.

``python -m parsl_bf.pilot.runner IN OUT`` (:func:`command`): ``IN`` holds
``parsl.serialize.pack_apply_message(func, args, kwargs)``. The runner calls the function and
writes its outcome to ``OUT`` atomically: ``serialize({"result": value})`` or, if it raised,
``serialize({"exception": RemoteExceptionWrapper(...)})``, which keeps the remote traceback.
:func:`read_outcome` reads it back for the executor. Exit 0 in both cases; 2 on bad input, 3
when the app ran but its outcome could not be written, 4 when that was for want of space: the
executor fails such an app with :func:`no_outcome_error` rather than running it again.

The exceptions defined here travel in outcome files: they pickle by reference to this module,
which both ends import.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any

from parsl.app.errors import RemoteExceptionWrapper
from parsl.serialize import deserialize

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_NO_OUTCOME",
    "EXIT_NO_SPACE",
    "EXIT_OK",
    "MODULE",
    "RunnerError",
    "UnpicklableError",
    "command",
    "command_args",
    "no_outcome_error",
    "read_outcome",
]

EXIT_OK, EXIT_BAD_INPUT, EXIT_NO_OUTCOME, EXIT_NO_SPACE = 0, 2, 3, 4
#: The runner's module (``python -m``).
MODULE = "parsl_bf.pilot.runner"


def command(
    src: str | os.PathLike[str], out: str | os.PathLike[str], python: str | None = None
) -> list[str]:
    """The runner's command line, ``[python, -m, parsl_bf.pilot.runner, IN, OUT]``."""
    return [python or sys.executable, "-m", MODULE, str(src), str(out)]


def command_args(argv: list[str]) -> tuple[str, str] | None:
    """``(IN, OUT)`` if ``argv`` is a :func:`command` (whatever its Python), else ``None``."""
    if len(argv) == 5 and argv[1:3] == ["-m", MODULE]:
        return argv[3], argv[4]
    return None


class RunnerError(RuntimeError):
    """The runner could not run the app: its input is missing or does not unpack."""


class UnpicklableError(RuntimeError):
    """Stands for an app's exception that could not be serialised: its type, text, traceback."""


def read_outcome(path: str | os.PathLike[str]) -> tuple[bool, Any]:
    """``(True, value)`` or ``(False, exception)`` from a runner's ``OUT`` file.

    The exception is the app's own (its remote traceback attached) when it could be
    serialised, else an :class:`UnpicklableError` with its type, text and traceback.
    Raises ``OSError`` if the file is missing, :class:`RunnerError` if it is not an outcome.
    """
    try:
        outcome = deserialize(Path(path).read_bytes())
    except OSError:
        raise
    except Exception as exc:
        raise RunnerError(f"{path}: not a runner outcome: {exc}") from exc
    if isinstance(outcome, dict) and "result" in outcome:
        return True, outcome["result"]
    if isinstance(outcome, dict) and "exception" in outcome:
        exc = outcome["exception"]
        if isinstance(exc, RemoteExceptionWrapper):
            exc = exc.get_exception()
        return False, exc
    raise RunnerError(f"{path}: not a runner outcome: {type(outcome).__name__}")


def no_outcome_error(code: int, out: str | os.PathLike[str], said: str) -> Exception | None:
    """What went wrong with an app whose runner exited with ``code`` leaving no outcome in
    ``out``, as the runner said it (``said``: the last line of its stderr, if any); None when
    it did not say (a process killed, with its pilot or not)."""
    if code == EXIT_NO_SPACE:  # its message may be lost with the disk: the code says it all
        error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out))
        error.add_note("The app ran, but its outcome could not be written.")
        return error
    if code in (EXIT_NO_OUTCOME, EXIT_BAD_INPUT):
        return RunnerError(f"runner exit {code}, no outcome in {out}: {said or '(no message)'}")
    return None
