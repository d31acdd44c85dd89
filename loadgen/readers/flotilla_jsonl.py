"""Flotilla JSONL, the canonical trace format (docs/trace-format.md).

One `TraceRequest.to_json_dict()` object per line. Every other reader converts into it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from loadgen.readers import _fields as typed
from loadgen.readers._io import TraceFormatError, numbered_lines
from loadgen.trace import TraceRequest

NAME = "flotilla"
_FIELDS = {field.name for field in dataclasses.fields(TraceRequest)}


def sniff(first_line: str) -> bool:
    """True when the first line looks like a Flotilla JSONL record."""
    return first_line.startswith("{") and '"timestamp_s"' in first_line


# field -> check of its JSON value (loadgen/readers/_fields.py); timestamp_s and output_length are required
_CHECKS = {"timestamp_s": typed.number, "output_length": typed.count, "input_length": typed.count,
           "prompt": typed.text, "session_id": typed.session, "hash_ids": typed.id_list,
           "block_tokens": typed.count, "lora": typed.text, "model": typed.text, "priority": typed.integer,
           "service_time_s": typed.number, "extra": typed.mapping}


def parse_record(row: object) -> TraceRequest:
    """One JSON object to a `TraceRequest`; an unknown key or a value of the wrong type is an
    error naming the field."""
    if not isinstance(row, dict):
        raise ValueError(f"must be a JSON object, not {type(row).__name__}")
    unknown = sorted(set(row) - _FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; known: {sorted(_FIELDS)}")
    for name in ("timestamp_s", "output_length"):
        typed.required(row, name)
    # null is the same as absent: the field keeps its default
    fields: dict[str, Any] = {name: _CHECKS[name](value, name) for name, value in row.items() if value is not None}
    return TraceRequest(**fields)


def read(path: str | Path) -> Iterator[TraceRequest]:
    """Stream the requests of a Flotilla JSONL trace, one line at a time."""
    for line_no, line in numbered_lines(path):
        try:
            yield parse_record(json.loads(line))
        except (ValueError, TypeError, RecursionError) as exc:
            raise TraceFormatError(path, line_no, f"bad Flotilla record: {exc}") from None


def write(requests: Iterable[TraceRequest], out: IO[str]) -> int:
    """Write `requests` as Flotilla JSONL; returns how many were written."""
    count = 0
    for req in requests:
        out.write(json.dumps(req.to_json_dict(), separators=(", ", ": ")) + "\n")
        count += 1
    return count
