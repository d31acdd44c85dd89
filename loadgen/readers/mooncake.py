"""Mooncake JSONL (kvcache-ai/Mooncake FAST'25 traces).

One object per line: `timestamp` in milliseconds from the trace start (sorted, not unique:
the conversation trace lands on ~3 s ticks), `input_length`, `output_length` and `hash_ids`
of 512-token prefix blocks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from loadgen.readers import _fields as typed
from loadgen.readers._io import TraceFormatError, numbered_lines
from loadgen.trace import MOONCAKE_BLOCK_TOKENS, TraceRequest

NAME = "mooncake"


def sniff(first_line: str) -> bool:
    """True when the first line looks like a Mooncake record."""
    return first_line.startswith("{") and '"timestamp"' in first_line and '"hash_ids"' in first_line


def parse_record(row: object) -> TraceRequest:
    """One Mooncake JSON object to a `TraceRequest` (milliseconds become seconds)."""
    if not isinstance(row, dict):
        raise ValueError(f"must be a JSON object, not {type(row).__name__}")
    hash_ids = row.get("hash_ids")
    return TraceRequest(
        timestamp_s=typed.number(typed.required(row, "timestamp"), "timestamp") / 1000.0,
        input_length=typed.count(typed.required(row, "input_length"), "input_length"),
        output_length=typed.count(typed.required(row, "output_length"), "output_length"),
        hash_ids=typed.id_list(hash_ids) if hash_ids is not None else (),
        block_tokens=MOONCAKE_BLOCK_TOKENS,
    )


def read(path: str | Path) -> Iterator[TraceRequest]:
    """Stream the requests of a Mooncake trace, one line at a time."""
    for line_no, line in numbered_lines(path):
        try:
            yield parse_record(json.loads(line))
        except (ValueError, TypeError, RecursionError) as exc:
            raise TraceFormatError(path, line_no, f"bad Mooncake record: {exc}") from None
