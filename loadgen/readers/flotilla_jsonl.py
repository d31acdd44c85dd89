"""Flotilla JSONL, the canonical trace format (docs/trace-format.md).

One `TraceRequest.to_json_dict()` object per line. Every other reader converts into it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from loadgen.readers._io import TraceFormatError, numbered_lines
from loadgen.trace import TraceRequest

NAME = "flotilla"
_FIELDS = {f.name for f in dataclasses.fields(TraceRequest)}


def sniff(first_line: str) -> bool:
    """True when the first line looks like a Flotilla JSONL record."""
    return first_line.startswith("{") and '"timestamp_s"' in first_line


def parse_record(row: dict[str, Any]) -> TraceRequest:
    """One JSON object to a `TraceRequest`; unknown keys are an error naming them."""
    unknown = sorted(set(row) - _FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; known: {sorted(_FIELDS)}")
    if "timestamp_s" not in row or "output_length" not in row:
        raise ValueError("timestamp_s and output_length are required")
    fields = dict(row)
    fields["hash_ids"] = tuple(int(h) for h in row.get("hash_ids", ()))
    fields["timestamp_s"] = float(row["timestamp_s"])
    return TraceRequest(**fields)


def read(path: str | Path) -> Iterator[TraceRequest]:
    """Stream the requests of a Flotilla JSONL trace, one line at a time."""
    for line_no, line in numbered_lines(path):
        try:
            yield parse_record(json.loads(line))
        except (ValueError, TypeError) as exc:
            raise TraceFormatError(path, line_no, f"bad Flotilla record: {exc}") from exc


def write(requests: Iterable[TraceRequest], out: IO[str]) -> int:
    """Write `requests` as Flotilla JSONL; returns how many were written."""
    count = 0
    for req in requests:
        out.write(json.dumps(req.to_json_dict(), separators=(", ", ": ")) + "\n")
        count += 1
    return count
