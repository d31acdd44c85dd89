"""The shape of a JSON document, to compare a look-alike's body with a real engine's capture.

A shape keeps every key (in order) and the type of every value; a list's shape is its fullest
item's shape, so two lists of different lengths with items alike have the same shape. Values
themselves (ids, times, generated text, numbers) are left out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

MAPS = frozenset({"top_logprobs"})
"""Keys whose dict values are maps of data (vLLM's top_logprobs: token -> logprob): their keys are
values, so only the value types count."""


def shape(value: Any, under: str = "") -> Any:
    """The shape of a decoded JSON value (`under`: the key it sits under)."""
    if isinstance(value, dict) and under in MAPS and not {"token", "logprob"} <= set(value):
        return ("map", frozenset(shape(v) for v in value.values()))
    if isinstance(value, dict):
        return tuple((k, shape(v, k)) for k, v in value.items())
    if isinstance(value, list):  # the fullest item's shape: an empty token's `bytes: []` is no other shape
        return ("list", max((shape(v, under) for v in value), key=lambda s: len(repr(s)), default=None))
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def captured(path: Path) -> tuple[dict, dict]:
    """(request, response body) of a `curl -i` capture and its .req.json."""
    request = json.loads(path.with_suffix(".req.json").read_text())
    body = re.split(r"\r?\n\r?\n", path.read_text(encoding="utf-8", errors="replace"), maxsplit=1)[1]
    return request, json.loads(body)
