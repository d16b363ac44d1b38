"""Run one plain Parsl app in a process of its own: ``python -m parsl_bf.pilot.runner IN OUT``.

``IN`` holds ``parsl.serialize.pack_apply_message(func, args, kwargs)``. The runner calls the
function and writes its outcome to ``OUT`` atomically (a temporary file, then a rename, so a
reader never sees half a file): ``serialize({"result": value})`` or, if it raised,
``serialize({"exception": RemoteExceptionWrapper(...)})``, which keeps the remote traceback.
:func:`~parsl_bf.pilot.outcome.read_outcome` reads it back for the executor. The command line,
the outcome and the exit codes are the contract of :mod:`parsl_bf.pilot.outcome`.

The executor sends :func:`~parsl_bf.pilot.outcome.command` with ``"warm": true``: the agent
runs it in a child forked from its warm host (:mod:`parsl_bf.pilot.warmhost`), which has
imported this module already, or as that command when it has no host.

Exit 0 in both cases: the exception travels in the file. Exit 2 on bad input (wrong arguments,
unreadable ``IN``, a buffer that does not unpack); the message goes to stderr and, when ``OUT``
can be written, an exception outcome saying the same goes there. Exit 3 when the app ran but
its outcome could not be written to ``OUT``, 4 when that was for want of space (a full disk,
whose stderr file may not take the message either). The executor fails such an app with
:func:`~parsl_bf.pilot.outcome.no_outcome_error` rather than running it again as if it had
been killed: it would find the same disk.
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

from .outcome import (
    EXIT_BAD_INPUT,
    EXIT_NO_OUTCOME,
    EXIT_NO_SPACE,
    EXIT_OK,
    MODULE,
    RunnerError,
    UnpicklableError,
)

__all__ = ["main"]


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
        print(f"usage: python -m {MODULE} IN OUT", file=sys.stderr)
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
    _code = main()
    for _stream in (sys.stdout, sys.stderr):
        try:
            _stream.flush()
        except OSError:  # a full disk: the app's output is lost, but not the code (not 120)
            os._exit(_code)
    sys.exit(_code)
