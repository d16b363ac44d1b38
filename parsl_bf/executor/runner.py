"""Run one plain Parsl app in a process of its own: ``python -m parsl_bf.executor.runner IN OUT``.

``IN`` holds ``parsl.serialize.pack_apply_message(func, args, kwargs)``. The runner calls the
function and writes its outcome to ``OUT`` atomically (a temporary file, then a rename, so a
reader never sees half a file): ``serialize({"result": value})`` or, if it raised,
``serialize({"exception": RemoteExceptionWrapper(...)})``, which keeps the remote traceback.
:func:`read_outcome` reads it back for the executor.

The executor sends :func:`command` with ``"warm": true``: the agent runs it in a child forked
from its warm host (:mod:`parsl_bf.executor.warmhost`), which has imported this module already,
or as that command when it has no host.

Exit 0 in both cases: the exception travels in the file. Exit 2 on bad input (wrong arguments,
unreadable ``IN``, a buffer that does not unpack); the message goes to stderr and, when ``OUT``
can be written, an exception outcome saying the same goes there. Exit 3 when the app ran but
its outcome could not be written to ``OUT``, 4 when that was for want of space (a full disk,
whose stderr file may not take the message either). The executor fails such an app with
:func:`no_outcome_error` rather than running it again as if it had been killed: it would find
the same disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from parsl.app.errors import RemoteExceptionWrapper
from parsl.serialize import deserialize, serialize, unpack_apply_message

__all__ = [
    "RunnerError",
    "UnpicklableError",
    "command",
    "command_args",
    "main",
    "no_outcome_error",
    "read_outcome",
]

EXIT_OK, EXIT_BAD_INPUT, EXIT_NO_OUTCOME, EXIT_NO_SPACE = 0, 2, 3, 4
MODULE = "parsl_bf.executor.runner"


def command(src: str | os.PathLike[str], out: str | os.PathLike[str], python: str | None = None):
    """The runner's command line, ``[python, -m, parsl_bf.executor.runner, IN, OUT]``."""
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


def _write(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file in the same directory)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # a shared file system may show the rename before the data
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _exception_outcome(exc: BaseException) -> bytes:
    """``{"exception": wrapper}``, serialised: the real exception if it can be."""
    try:
        data = serialize({"exception": RemoteExceptionWrapper(type(exc), exc, exc.__traceback__)})
        deserialize(data)  # some pickle but do not unpickle (a custom __init__ signature)
        return data
    except Exception as err:
        text = "".join(traceback.format_exception(exc))
        stand_in = UnpicklableError(
            f"{type(exc).__module__}.{type(exc).__qualname__}: {exc} "
            f"(the exception could not be serialised: {err})\n{text}"
        )
        return serialize({"exception": RemoteExceptionWrapper(UnpicklableError, stand_in, None)})


def _result_outcome(value: Any) -> bytes:
    try:
        return serialize({"result": value})
    except Exception as exc:  # the app ran, but its value cannot travel: that is its outcome
        return _exception_outcome(exc)


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


def _say(message: str) -> None:
    """A line on stderr, if its file takes it (on a full disk it may not: the code says it)."""
    with contextlib.suppress(OSError):
        print(f"parsl-bf runner: {message}", file=sys.stderr, flush=True)


def _bad_input(message: str, out: str | None) -> int:
    _say(message)
    if out is not None:
        try:
            _write(out, _exception_outcome(RunnerError(message)))
        except Exception as exc:
            _say(f"cannot write {out}: {exc}")
    return EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    """Run the app in ``IN``, write its outcome to ``OUT``; returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m parsl_bf.executor.runner IN OUT", file=sys.stderr)
        return EXIT_BAD_INPUT
    src, out = args
    try:
        func, f_args, f_kwargs = unpack_apply_message(Path(src).read_bytes())
    except Exception as exc:  # unreadable, truncated, or an app whose modules are missing here
        return _bad_input(f"cannot unpack {src}: {type(exc).__name__}: {exc}", out)
    try:
        outcome = _result_outcome(func(*f_args, **f_kwargs))
    except BaseException as exc:  # SystemExit from an app is its outcome too
        outcome = _exception_outcome(exc)
    try:
        _write(out, outcome)
    except Exception as exc:
        _say(f"cannot write {out}: {exc}")
        full = isinstance(exc, OSError) and exc.errno == errno.ENOSPC
        return EXIT_NO_SPACE if full else EXIT_NO_OUTCOME
    return EXIT_OK


if __name__ == "__main__":
    # Run as the importable module, not as __main__: the exceptions defined here must pickle
    # by reference to parsl_bf.executor.runner for the executor to unpickle them.
    from parsl_bf.executor.runner import main as _main

    _code = _main()
    for _stream in (sys.stdout, sys.stderr):
        try:
            _stream.flush()
        except OSError:  # a full disk: the app's output is lost, but not the code (not 120)
            os._exit(_code)
    sys.exit(_code)
