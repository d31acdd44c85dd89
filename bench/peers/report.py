"""Tables of the peer benchmarks (median over rounds with the [min–max] spread) and their
blocks in docs/benchmarks.md; the rest of that file is left alone."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

NOISY = "†"


def spread(values: Iterable[float | None]) -> tuple[float, float, float] | None:
    """(median, min, max) of the values that exist; None when none do."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return None
    return statistics.median(vals), min(vals), max(vals)


def cell(values: Iterable[float | None], digits: int = 2, scale: float = 1.0) -> str:
    """'median [min–max]' over rounds; one value alone when all rounds agree at this precision."""
    s = spread(None if v is None else v * scale for v in values)
    if s is None:
        return "–"
    med, lo, hi = (f"{x:,.{digits}f}" for x in s)
    return med if lo == hi else f"{med} [{lo}–{hi}]"


def added(values: Sequence[float], base: Sequence[float], digits: int = 2) -> str:
    """Median of the target minus median of the direct connection, signed."""
    s, b = spread(values), spread(base)
    if s is None or b is None:
        return "–"
    return f"{s[0] - b[0]:+,.{digits}f}"


def write_block(path: Path, name: str, text: str) -> None:
    """Replace the block between `<!-- name:start -->` and `<!-- name:end -->`, or append it."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{text.strip()}\n{end}"
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    new = pattern.sub(lambda _: block, old) if pattern.search(old) else old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
