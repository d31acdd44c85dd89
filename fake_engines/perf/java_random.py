"""java.util.Random, bit for bit: the lesson's Example 8 routes tokens with `new Random(7)`.

Reproducing the generator (a 48-bit linear congruential generator, and the polar method for
Gaussians) lets the library replay the example's token routing and assert every figure it
prints, instead of only the ones that follow from the expert loads.
"""

from __future__ import annotations

import math

_MULTIPLIER = 0x5DEECE66D
_ADDEND = 0xB
_MASK = (1 << 48) - 1


class JavaRandom:
    """The subset of java.util.Random the lesson uses: nextDouble and nextGaussian."""

    def __init__(self, seed: int) -> None:
        self._seed = (seed ^ _MULTIPLIER) & _MASK
        self._next_gaussian: float | None = None

    def _next(self, bits: int) -> int:
        self._seed = (self._seed * _MULTIPLIER + _ADDEND) & _MASK
        value = self._seed >> (48 - bits)
        return value - (1 << 32) if value >= 1 << 31 else value  # the cast to Java's 32-bit int

    def next_double(self) -> float:
        return ((self._next(26) << 27) + self._next(27)) * 2.0**-53

    def next_gaussian(self) -> float:
        if self._next_gaussian is not None:
            value, self._next_gaussian = self._next_gaussian, None
            return value
        while True:
            v1, v2 = 2 * self.next_double() - 1, 2 * self.next_double() - 1
            s = v1 * v1 + v2 * v2
            if 0 < s < 1:
                break
        multiplier = math.sqrt(-2 * math.log(s) / s)
        self._next_gaussian = v2 * multiplier
        return v1 * multiplier
