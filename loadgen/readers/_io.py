"""Shared file handling for the readers: text lines streamed from plain or gzip files."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import IO


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
    with open_text(path) as fh:
        for line_no, line in enumerate(fh, start=1):
            stripped = line.strip()
            if stripped:
                yield line_no, stripped
