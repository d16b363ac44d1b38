"""Errors in replay input files."""

from __future__ import annotations

__all__ = ["ReplayInputError"]


class ReplayInputError(ValueError):
    """A trace or job-set problem, located as ``file:line field: message``."""

    def __init__(
        self, path: object, message: str, line: int | None = None, field: str = ""
    ) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where} {field}: {message}" if field else f"{where}: {message}")
        self.path, self.line, self.field, self.message = str(path), line, field, message
