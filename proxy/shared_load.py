"""Per-backend in-flight work shared by the workers of `flotilla proxy --workers N` (proxy/workers.py
says how the workers share everything else).

An anonymous shared memory map with one row per worker; each worker writes only its own row
(plain stores, no lock, no read-modify-write across processes) and a routing decision adds up
the other rows. The parent zeroes a dead worker's row. Backends get their column by a hash of
their URL, claimed under a file lock when a backend is first seen (not on the request path).
Each request writes its worker's row twice and reads the others' once: this module is compiled
with the rest of the request path (proxy/build.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
from collections.abc import Iterator
from pathlib import Path

SLOTS = 1024
"""Backends the shared in-flight table can name over a proxy's life."""
DIGEST_BYTES = 16


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class SharedLoad:
    """Per-backend in-flight requests and reserved tokens, one row per worker (see the module)."""

    def __init__(self, workers: int, lock_path: Path) -> None:
        self.workers = workers
        self.lock_path = lock_path
        self.row = -1
        """This process's row; -1 in the parent, which only reads and zeroes."""
        names = SLOTS * DIGEST_BYTES
        cells = workers * SLOTS * 2 * 8
        # Anonymous and shared: forked workers inherit the mapping, nothing is left behind by name.
        self._map = mmap.mmap(-1, names + cells + workers * 2 * 8, flags=mmap.MAP_SHARED)
        self._names = memoryview(self._map)[:names]
        self._cells = memoryview(self._map)[names:names + cells].cast("q")
        self._stats = memoryview(self._map)[names + cells:].cast("q")
        """Per worker: requests arrived over the proxy's life, requests held now (the autoscaler's)."""
        self._slots: dict[str, int] = {}

    def slot_of(self, url: str) -> int:
        """The column of `url`, the same in every worker."""
        slot = self._slots.get(url)
        if slot is None:
            digest = hashlib.blake2b(url.encode(), digest_size=DIGEST_BYTES).digest()
            slot = self._find(digest)
            if slot is None:
                with file_lock(self.lock_path):  # two workers seeing a new backend at once
                    slot = self._find(digest, claim=True)
            assert slot is not None  # claiming finds a slot or raises
            self._slots[url] = slot
        return slot

    def _find(self, digest: bytes, claim: bool = False) -> int | None:
        start = int.from_bytes(digest[:4], "little") % SLOTS
        empty = bytes(DIGEST_BYTES)
        for i in range(SLOTS):
            slot = (start + i) % SLOTS
            name = self._names[slot * DIGEST_BYTES:(slot + 1) * DIGEST_BYTES]
            if name == digest:
                return slot
            if name == empty:
                if not claim:
                    return None
                self._names[slot * DIGEST_BYTES:(slot + 1) * DIGEST_BYTES] = digest
                return slot
        raise RuntimeError(f"more than {SLOTS} backends over this proxy's life; restart it")

    def publish(self, slot: int, requests: int, tokens: int) -> None:
        """This worker's in-flight work to the backend in `slot` (only this worker writes its row)."""
        base = (self.row * SLOTS + slot) * 2
        self._cells[base] = requests
        self._cells[base + 1] = tokens

    def peers(self, slot: int) -> tuple[int, int]:
        """The other workers' in-flight requests and tokens to the backend in `slot`."""
        requests = tokens = 0
        cells = self._cells
        for row in range(self.workers):
            if row != self.row:
                base = (row * SLOTS + slot) * 2
                requests += cells[base]
                tokens += cells[base + 1]
        return requests, tokens

    def zero_row(self, row: int) -> None:
        """A dead worker's requests are over (its connections died with it); its arrivals stay
        counted, so the proxy's total never goes back."""
        start = row * SLOTS * 2
        for i in range(start, start + SLOTS * 2):
            self._cells[i] = 0
        self._stats[row * 2 + 1] = 0

    def arrived(self) -> int:
        """The arrivals this worker's row counts (a restarted worker goes on from there)."""
        return self._stats[self.row * 2]

    def publish_counts(self, arrived: int, held: int) -> None:
        """This worker's arrivals so far and requests held now (only this worker writes its row)."""
        self._stats[self.row * 2] = arrived
        self._stats[self.row * 2 + 1] = held

    def total_arrived(self) -> int:
        return sum(self._stats[row * 2] for row in range(self.workers))

    def total_held(self) -> int:
        return sum(self._stats[row * 2 + 1] for row in range(self.workers))
