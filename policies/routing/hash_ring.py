"""A consistent-hash ring over backend URLs, and the stable hash it (and the prefix index) uses.

Python's built-in `hash` of a string changes from one process to the next, so a router restart
or a second router replica would place the same session elsewhere; blake2b does not.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence

from policies.routing.base import BackendView


def stable_hash(data: str | bytes) -> int:
    """A 64-bit hash that is the same in every process and on every machine."""
    raw = data.encode() if isinstance(data, str) else data
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big")


class HashRing:
    """Each backend URL owns `vnodes` points on a 64-bit ring; a key belongs to the next point.

    Keyed by URL rather than pool position, so adding or removing one backend moves only the
    keys that backend gains or loses (about 1/n of them).
    """

    def __init__(self, urls: Sequence[str], vnodes: int = 160) -> None:
        points = sorted((stable_hash(f"{url}#{v}"), url) for url in urls for v in range(vnodes))
        self._hashes = [h for h, _ in points]  # ring positions, ascending
        self._owners = [u for _, u in points]  # URL owning each position
        self.urls = tuple(urls)

    def walk(self, key: str) -> list[str]:
        """Distinct URLs in ring order, starting with the key's owner (its home)."""
        if not self._hashes:
            return []
        start = bisect.bisect(self._hashes, stable_hash(key)) % len(self._hashes)
        seen: dict[str, None] = {}
        for i in range(len(self._owners)):
            seen.setdefault(self._owners[(start + i) % len(self._owners)], None)
            if len(seen) == len(self.urls):
                break
        return list(seen)


class RingCache:
    """Rebuilds the ring only when the set of backend URLs changes."""

    def __init__(self, vnodes: int = 160) -> None:
        self.vnodes = vnodes
        self._ring = HashRing((), vnodes)

    def ring_for(self, backends: Sequence[BackendView]) -> HashRing:
        urls = tuple(sorted({b.url for b in backends}))
        if urls != self._ring.urls:
            self._ring = HashRing(urls, self.vnodes)
        return self._ring

    def walk(self, backends: Sequence[BackendView], key: str) -> list[BackendView]:
        """Backends in ring order for `key`, home first."""
        by_url = {b.url: b for b in backends}
        return [by_url[u] for u in self.ring_for(backends).walk(key)]
