"""Azure LLM inference trace CSV (Azure/AzurePublicDataset, Splitwise 2023).

Header `TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP is absolute wall-clock time with
7 fractional digits. Arrivals become seconds after the first row.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from loadgen.readers import _fields as typed
from loadgen.readers._io import TraceFormatError, csv_rows
from loadgen.trace import TraceRequest

NAME = "azure"
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def sniff(first_line: str) -> bool:
    """True when the first line is the Azure header."""
    return all(col in first_line for col in COLUMNS)


def _when(row: dict[str | None, str | None]) -> datetime:
    cell = (row.get("TIMESTAMP") or "").strip()
    try:
        return datetime.fromisoformat(cell)
    except ValueError:
        raise ValueError(f'TIMESTAMP="{cell}": must be a date and time, e.g. 2023-11-16 18:15:46.6805900') from None


def read(path: str | Path) -> Iterator[TraceRequest]:
    """Stream the requests of an Azure trace, one row at a time."""
    t0: datetime | None = None
    for line_no, row in csv_rows(path):
        try:
            when = _when(row)
            t0 = when if t0 is None else t0
            yield TraceRequest(
                timestamp_s=(when - t0).total_seconds(),
                input_length=typed.cell_count(row, "ContextTokens"),
                output_length=typed.cell_count(row, "GeneratedTokens"),
            )
        except (ValueError, TypeError) as exc:
            raise TraceFormatError(path, line_no, f"bad Azure row: {exc}") from None
