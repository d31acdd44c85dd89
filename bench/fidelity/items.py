"""One fidelity item and the counts over many."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("capture", "recording", "error", "metric", "sdk")
VERDICTS = ("matched", "accepted", "differs", "missing")


@dataclass(frozen=True)
class Item:
    """One thing the real engine did (a capture, an error row, a metric family, an SDK call) and
    what the look-alike did with it."""

    engine: str
    name: str
    verdict: str
    """matched, accepted (a difference listed with its reason), differs, missing."""
    detail: str = ""
    kind: str = "capture"


def summary(items: list[Item]) -> dict[str, dict[str, int]]:
    """Counts by verdict, per kind and in total ("total")."""
    out = {kind: dict.fromkeys(VERDICTS, 0) for kind in (*KINDS, "total")}
    for item in items:
        out[item.kind][item.verdict] += 1
        out["total"][item.verdict] += 1
    return out
