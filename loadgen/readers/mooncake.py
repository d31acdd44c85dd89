"""Mooncake JSONL (kvcache-ai/Mooncake FAST'25 traces).

One object per line: `timestamp` in milliseconds from the trace start (sorted, not unique:
the conversation trace lands on ~3 s ticks), `input_length`, `output_length` and `hash_ids`
of 512-token prefix blocks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadgen.readers._io import TraceFormatError, numbered_lines
from loadgen.trace import MOONCAKE_BLOCK_TOKENS, TraceRequest

NAME = "mooncake"


def sniff(first_line: str) -> bool:
    """True when the first line looks like a Mooncake record."""
    return first_line.startswith("{") and '"timestamp"' in first_line and '"hash_ids"' in first_line


def parse_record(row: dict[str, Any]) -> TraceRequest:
    """One Mooncake JSON object to a `TraceRequest` (milliseconds become seconds)."""
    return TraceRequest(
        timestamp_s=row["timestamp"] / 1000.0,
        input_length=int(row["input_length"]),
        output_length=int(row["output_length"]),
        hash_ids=tuple(int(h) for h in row.get("hash_ids", ())),
        block_tokens=MOONCAKE_BLOCK_TOKENS,
    )


def read(path: str | Path) -> Iterator[TraceRequest]:
    """Stream the requests of a Mooncake trace, one line at a time."""
    for line_no, line in numbered_lines(path):
        try:
            yield parse_record(json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceFormatError(path, line_no, f"bad Mooncake record: {exc!r}") from exc
