"""Azure LLM inference trace CSV (Azure/AzurePublicDataset, Splitwise 2023).

Header `TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP is absolute wall-clock time with
7 fractional digits. Arrivals become seconds after the first row.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from loadgen.readers._io import TraceFormatError, open_text
from loadgen.trace import TraceRequest

NAME = "azure"
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def sniff(first_line: str) -> bool:
    """True when the first line is the Azure header."""
    return all(col in first_line for col in COLUMNS)


def read(path: str | Path) -> Iterator[TraceRequest]:
    """Stream the requests of an Azure trace, one row at a time."""
    with open_text(path) as fh:
        rows = csv.DictReader(fh)
        t0: datetime | None = None
        for row in rows:
            try:
                when = datetime.fromisoformat(row["TIMESTAMP"])
                t0 = when if t0 is None else t0
                yield TraceRequest(
                    timestamp_s=(when - t0).total_seconds(),
                    input_length=int(row["ContextTokens"]),
                    output_length=int(row["GeneratedTokens"]),
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise TraceFormatError(path, rows.line_num, f"bad Azure row: {exc!r}") from exc
