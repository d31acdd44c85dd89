"""Type checks of trace fields, shared by the readers.

Each check returns the value as the `TraceRequest` field wants it or raises ValueError naming the
field, the value and what it must be; the reader adds the file and line (TraceFormatError).
JSON values must already have the right type (the string "12" is not a length); CSV cells are
text and are parsed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

MISSING = object()
"""A key absent from the record (distinct from a JSON null)."""


def _fail(name: str, value: object, what: str) -> ValueError:
    shown = json.dumps(value, default=repr)  # as the file spells it: true, "12", null
    return ValueError(f"{name}={shown}: must be {what}")


def required(row: Mapping[str, Any], name: str) -> Any:
    """row[name]; ValueError naming the field when it is absent or null."""
    value = row.get(name)
    if value is None:
        raise ValueError(f"{name} is required")
    return value


def count(value: object, name: str) -> int:
    """A non-negative integer; 12.0 passes as 12 (JSON writers often print integers so)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(name, value, "a non-negative integer")
    return value


def number(value: object, name: str) -> float:
    """A finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(name, value, "a finite number")
    return float(value)


def integer(value: object, name: str) -> int:
    """Any integer (priorities may be negative)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, value, "an integer")
    return value


def text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise _fail(name, value, "a string")
    return value


def session(value: object, name: str = "session_id") -> str:
    """A session id: a string, or an integer read as its decimal string, so 0 and "0" are one session."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise _fail(name, value, "a string or an integer")


def id_list(value: object, name: str = "hash_ids") -> tuple[int, ...]:
    """A list of integer block ids."""
    if not isinstance(value, list):
        raise _fail(name, value, "a list of integers")
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int):
            raise _fail(f"{name}[{i}]", item, "an integer")
    return tuple(value)


def mapping(value: object, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(name, value, "an object")
    return value


def cell_count(row: Mapping[str | None, str | None], column: str) -> int:
    """A CSV cell holding a non-negative integer."""
    cell = (row.get(column) or "").strip()
    if not cell:
        raise ValueError(f"{column} is missing")
    try:
        return count(int(cell), column)
    except ValueError:
        raise _fail(column, cell, "a non-negative integer") from None


def cell_number(row: Mapping[str | None, str | None], column: str) -> float:
    """A CSV cell holding a finite number."""
    cell = (row.get(column) or "").strip()
    if not cell:
        raise ValueError(f"{column} is missing")
    try:
        return number(float(cell), column)
    except ValueError:
        raise _fail(column, cell, "a finite number") from None
