"""Typed errors of the trace area."""

from __future__ import annotations


class TraceError(ValueError):
    """A trace file, spec or transform argument is invalid.

    `path`, `line` and `field` name where (1-based line numbers, as an editor
    shows them; the header is line 1 of a CSV) when the problem is in a file.
    """

    def __init__(self, message: str, path: str | None = None, line: int | None = None, field: str | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        what = f"field `{field}`: " if field is not None else ""
        super().__init__(f"{where}{what}{message}")
        self.path = path
        self.line = line
        self.field = field
