"""Errors in input files (idle-node traces, job sets, SWF logs), and the bounded readers that
raise them.

Trace, job-set and SWF files are input, not trusted: every reader here is bounded (file and
line sizes, counts) and turns any malformed content (binary data, truncated or random gzip,
text that is not UTF-8, CSV it cannot split, JSON nested too deeply) into one
:class:`ReplayInputError` naming the file, the line and the field, never a traceback.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..allocation.errors import json_line
from ..allocation.spec import MAX_NODES, MAX_SECONDS, MAX_WORK

__all__ = [
    "MAX_EVENTS",
    "MAX_JOBS",
    "MAX_JSON_BYTES",
    "MAX_LINE_BYTES",
    "MAX_NODES",
    "MAX_SECONDS",
    "MAX_TEXT_BYTES",
    "MAX_WORK",
    "ReplayInputError",
    "csv_errors",
    "read_json",
    "text_lines",
]

#: The most node state changes in a trace (rows of ``events.csv.gz``, or implied by an SWF
#: log): the 4,734-node dev trace has 0.45 million in its week, so this is most of a year.
MAX_EVENTS = 20_000_000
#: The most jobs in a job set or an SWF log.
MAX_JOBS = 1_000_000
#: The most bytes of text in one file (after decompression).
MAX_TEXT_BYTES = 2 << 30
#: The longest line of a CSV or SWF file, in bytes.
MAX_LINE_BYTES = 1 << 20
#: The largest JSON file (job set, ``meta.json``), in bytes.
MAX_JSON_BYTES = 256 << 20
_DIGITS = re.compile(r"[0-9]{1,18}")


class ReplayInputError(ValueError):
    """A trace or job-set problem, located as ``file:line field: message``."""

    def __init__(
        self, path: object, message: str, line: int | None = None, field: str = ""
    ) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where} {field}: {message}" if field else f"{where}: {message}")
        self.path, self.line, self.field, self.message = str(path), line, field, message


def text_lines(
    path: Path, compressed: bool = False, max_bytes: int = MAX_TEXT_BYTES
) -> Iterator[str]:
    """The lines of a UTF-8 text file (gzip-compressed if ``compressed``), line ends kept, as
    ``csv.reader`` takes them. A missing file is the OSError of ``open``; anything else wrong
    is a ReplayInputError at its line: a line longer than :data:`MAX_LINE_BYTES`, more than
    ``max_bytes`` in all, a NUL byte or bytes that are not UTF-8, gzip data that is truncated
    or corrupt."""
    n, total = 0, 0
    with path.open("rb") as raw:
        f = gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw
        while True:
            try:
                line = f.readline(MAX_LINE_BYTES + 1)
            except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                what = "truncated" if isinstance(exc, EOFError) else "corrupt"
                message = f"not a readable gzip file ({what}: {exc})"
                raise ReplayInputError(path, message, n + 1) from None
            if not line:
                return
            n += 1
            total += len(line)
            if len(line) > MAX_LINE_BYTES:
                raise ReplayInputError(path, f"line longer than {MAX_LINE_BYTES} bytes", n)
            if total > max_bytes:
                raise ReplayInputError(path, f"more than {max_bytes} bytes of text", n)
            if b"\0" in line:
                raise ReplayInputError(path, "not text: a NUL byte", n)
            try:
                yield line.decode("utf-8")
            except UnicodeDecodeError:
                raise ReplayInputError(path, "not UTF-8 text", n) from None


@contextmanager
def csv_errors(path: Path, reader: Any) -> Iterator[None]:
    """What ``csv`` cannot split (a NUL byte, an over-long field) as a located error."""
    try:
        yield
    except csv.Error as exc:
        raise ReplayInputError(path, f"not CSV: {exc}", reader.line_num or 1) from None


def read_json(path: Path, max_bytes: int = MAX_JSON_BYTES) -> tuple[Any, str]:
    """(data, text) of a JSON file of at most ``max_bytes``; ReplayInputError (with the line
    where it has one) for anything that is not JSON."""
    with path.open("rb") as f:
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise ReplayInputError(path, f"larger than {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
        return json.loads(text), text
    except UnicodeDecodeError as exc:
        raise ReplayInputError(path, "not UTF-8 text", raw[: exc.start].count(b"\n") + 1) from None
    except json.JSONDecodeError as exc:
        raise ReplayInputError(path, f"not JSON: {exc.msg}", exc.lineno) from None
    except RecursionError:
        raise ReplayInputError(path, "not JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ReplayInputError(path, f"not JSON: {exc}") from None


def json_error(path: Path, text: str, field: str, message: str) -> ReplayInputError:
    """A ReplayInputError at ``field``'s line in the JSON ``text``."""
    return ReplayInputError(path, message, json_line(text, field), field)


def integer(value: Any, low: int, high: int) -> int:
    """``value`` (an int, an integral float, or digits) as an int in [low, high]; else
    ValueError saying what is expected."""
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        number: Any = int(value.strip())
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    else:
        raise ValueError(f"not an integer: {value!r}")
    return _within(number, value, low, high)


def number(value: Any, low: float, high: float) -> float:
    """``value`` (a number, or a string of one) as a finite float in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"not a number: {value!r}")
    try:
        x = float(value)
    except (ValueError, OverflowError):
        raise ValueError(f"not a number: {value!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"not a finite number: {value!r}")
    return _within(x, value, low, high)


def _within(x: Any, value: Any, low: float, high: float) -> Any:
    if x < low:
        raise ValueError(f"{value!r} is less than {low:g}")
    if x > high:
        raise ValueError(f"{value!r} is more than the limit of {high:g}")
    return x
