"""Reading a KV-event capture as scripts/interop/capture_kv_events.py writes it (frames.jsonl,
decoded.jsonl; tests/data/real-engines/vllm/kv-events is the real engine's), for the look-alike's
reference test and the interop suite alike."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import DATA

REFERENCE = DATA / "real-engines" / "vllm" / "kv-events"
"""The real vLLM 0.32 capture."""


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def key_sets(decoded: list[dict]) -> dict[str, set[str]]:
    """Event type -> the keys its events carry, over a decoded stream."""
    keys: dict[str, set[str]] = {}
    for message in decoded:
        for event in message["batch"][1]:
            keys.setdefault(event["type"], set()).update(event)
    return keys
