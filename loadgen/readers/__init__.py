"""Streaming trace readers: Mooncake JSONL, Azure CSV, BurstGPT CSV and Flotilla JSONL.

Each reader module exposes NAME, `sniff(first_line)` and `read(path) -> Iterator[TraceRequest]`
and holds one row in memory at a time, so traces of any size replay in constant memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from loadgen.readers import azure, burstgpt, flotilla_jsonl, mooncake
from loadgen.readers._io import TraceFormatError, numbered_lines
from loadgen.trace import TraceRequest

# format name -> reader module; flotilla is sniffed first since its records are JSON too
READERS: dict[str, ModuleType] = {m.NAME: m for m in (flotilla_jsonl, mooncake, azure, burstgpt)}

__all__ = ["READERS", "TraceFormatError", "detect_format", "read_trace"]


def detect_format(path: str | Path) -> str:
    """Name of the format of `path`, recognised from its first non-blank line."""
    for _, first in numbered_lines(path):
        for name, module in READERS.items():
            if module.sniff(first):
                return name
        raise TraceFormatError(path, 1, f"unknown trace format; name one of {sorted(READERS)} with --format")
    raise TraceFormatError(path, 1, "empty trace")


def read_trace(path: str | Path, fmt: str | None = None) -> Iterator[TraceRequest]:
    """Stream the requests of `path`, in `fmt` or the format recognised from the file."""
    name = fmt or detect_format(path)
    if name not in READERS:
        raise ValueError(f"unknown trace format {name!r}; known: {sorted(READERS)}")
    return READERS[name].read(path)
