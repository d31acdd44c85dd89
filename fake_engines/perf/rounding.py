"""Fixed-point text with half-up rounding, the way the lesson's printf output rounds.

Python's format rounds the binary value half-to-even (2.125 -> "2.12"); printf in the lesson
rounds the shortest decimal form half-up (2.125 -> "2.13"). Tables must match digit for digit.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal


def fixed(value: float, digits: int) -> str:
    """``value`` with ``digits`` decimals, halves rounded away from zero."""
    quantum = Decimal(1).scaleb(-digits)
    return str(Decimal(repr(float(value))).quantize(quantum, rounding=ROUND_HALF_UP))


def percent(share: float, digits: int = 1) -> str:
    """A share in [0, 1] as a percentage string with ``digits`` decimals, no % sign."""
    return fixed(share * 100.0, digits)
