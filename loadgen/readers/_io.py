"""Shared file handling for the readers: text lines streamed from plain or gzip files."""

from __future__ import annotations

import csv
import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

# what reading a file that is not a (complete) text trace raises
_UNREADABLE: dict[type[Exception], str] = {UnicodeDecodeError: "not UTF-8 text", EOFError: "truncated gzip file",
               gzip.BadGzipFile: "not a gzip file", zlib.error: "corrupt gzip data"}


class TraceFormatError(ValueError):
    """A trace line that cannot be read; names the file and line."""

    def __init__(self, path: str | Path, line_no: int, reason: str) -> None:
        super().__init__(f"{path}:{line_no}: {reason}")
        self.path = str(path)
        self.line_no = line_no
        self.reason = reason


def open_text(path: str | Path) -> IO[str]:
    """Open a trace for streaming text reads; `.gz` files are decompressed on the fly."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def numbered_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, stripped line) for each non-blank line, one at a time."""
    line_no = 0
    with open_text(path) as fh:
        try:
            for line_no, line in enumerate(fh, start=1):
                stripped = line.strip()
                if stripped:
                    yield line_no, stripped
        except tuple(_UNREADABLE) as exc:
            raise _unreadable(path, line_no + 1, exc) from None


def csv_rows(path: str | Path) -> Iterator[tuple[int, dict[str | None, str | None]]]:
    """(line number, row by header) for each CSV row after the header, one at a time."""
    with open_text(path) as fh:
        rows = csv.DictReader(fh)
        try:
            for row in rows:
                yield rows.line_num, row
        except csv.Error as exc:
            raise TraceFormatError(path, rows.line_num, f"bad CSV: {exc}") from None
        except tuple(_UNREADABLE) as exc:
            raise _unreadable(path, rows.line_num + 1, exc) from None


def _unreadable(path: str | Path, line_no: int, exc: BaseException) -> TraceFormatError:
    reason = next(text for kind, text in _UNREADABLE.items() if isinstance(exc, kind))
    return TraceFormatError(path, line_no, reason)
