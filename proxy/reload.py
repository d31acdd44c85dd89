"""Watch the fleet file and bring the file-managed backends in line with it when it changes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from proxy.config import BackendSpec, ConfigError, load_fleet
from proxy.pool import Backend, BackendPool

log = logging.getLogger(__name__)


def apply_fleet(pool: BackendPool, specs: tuple[BackendSpec, ...], source: str = "file") -> list[Backend]:
    """Add or update the backends of `source` (the fleet file, or a discovered Service), drain
    those of its backends it no longer lists; return the new ones."""
    wanted = {s.url: s for s in specs}
    known = {b.url for b in pool}
    for b in list(pool):
        if b.source == source and b.url not in wanted:
            pool.drain(b.url)
    return [pool.add(spec, source=source) for url, spec in wanted.items() if url not in known]


class FleetWatcher:
    def __init__(self, path: Path, pool: BackendPool, interval_s: float,
                 on_added: Callable[[Backend], Awaitable[None]],
                 prefill: tuple[BackendPool, Callable[[Backend], Awaitable[None]]] | None = None) -> None:
        self.path = path
        self.pool = pool
        self.interval_s = interval_s
        self.on_added = on_added
        self.prefill = prefill
        """P/D (proxy/pd.py): the prefill pool, which takes the file's `role: prefill` backends, and
        its probe for new ones."""
        self._stamp: tuple[float, int] | None = None

    def _current_stamp(self) -> tuple[float, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime, st.st_size

    async def run(self) -> None:
        """Check every interval until cancelled; no bad edit or surprise ends the watching."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except Exception as exc:  # a bug must not stop later edits from being applied
                log.error("fleet file %s not reloaded, the last good one stays: %s", self.path,
                          one_line(repr(exc)))

    async def check(self) -> bool:
        """Reload if the file changed; True when it did and parsed. An invalid file (unreadable,
        bad YAML, a wrong value or type) keeps the last good backends and logs why in one line;
        the next change is read again."""
        stamp = self._current_stamp()
        if stamp is None or stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            fleet = load_fleet(self.path)
        except (OSError, ConfigError) as exc:
            log.error("fleet file %s not reloaded, the last good one stays: %s", self.path, one_line(str(exc)))
            return False
        # P/D: `role: prefill` backends are the prefill pool's (proxy/pd.py), the others this pool's
        for backend in apply_fleet(self.pool, tuple(b for b in fleet.backends if b.role != "prefill")):
            await self.on_added(backend)
        if self.prefill is not None:
            prefill_pool, probe = self.prefill
            for backend in apply_fleet(prefill_pool, tuple(b for b in fleet.backends if b.role == "prefill")):
                await probe(backend)
        log.info("fleet file %s reloaded: %d backends", self.path, len(fleet.backends))
        return True


def one_line(text: str) -> str:
    """A message fit for one log line: a client or an editor may put newlines in it."""
    return " ".join(text.split())
