"""BurstGPT CSV (HPMLL/BurstGPT).

Header `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`; release v2.0
(`BurstGPT_3.csv`) adds `Session ID` and `Elapsed time`. Timestamp is seconds from 00:00 of
day one, kept as is (the runner schedules relative to the first request). The Model column
names the upstream service (ChatGPT, GPT-4), not a model the target serves, so it is kept in
`extra["burstgpt_model"]` rather than in `model`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from loadgen.readers import _fields as typed
from loadgen.readers._io import TraceFormatError, csv_rows
from loadgen.trace import TraceRequest

NAME = "burstgpt"
COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def sniff(first_line: str) -> bool:
    """True when the first line is a BurstGPT header."""
    return all(col in first_line for col in COLUMNS)


def _optional(row: dict[str | None, str | None], column: str) -> str | None:
    value = (row.get(column) or "").strip()
    return value or None


def _request(row: dict[str | None, str | None]) -> TraceRequest:
    session = _optional(row, "Session ID")
    extra = {key: value for key, value in (("burstgpt_model", _optional(row, "Model")),
                                            ("log_type", _optional(row, "Log Type"))) if value}
    return TraceRequest(
        timestamp_s=typed.cell_number(row, "Timestamp"),
        input_length=typed.cell_count(row, "Request tokens"),
        output_length=typed.cell_count(row, "Response tokens"),
        session_id=session,
        service_time_s=typed.cell_number(row, "Elapsed time") if _optional(row, "Elapsed time") else None,
        extra=extra,
    )


def read(path: str | Path) -> Iterator[TraceRequest]:
    """Stream the requests of a BurstGPT trace, one row at a time."""
    for line_no, row in csv_rows(path):
        try:
            yield _request(row)
        except (ValueError, TypeError) as exc:
            raise TraceFormatError(path, line_no, f"bad BurstGPT row: {exc}") from None
