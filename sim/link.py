"""A link shared by concurrent KV transfers, under virtual time: processor sharing.

Each transfer first waits the link's fixed latency (it uses no bandwidth), then its bytes flow;
the transfers flowing at one moment share the link's bandwidth equally (RDMA reads from several
peers into one NIC get about a fair share each). One transfer alone takes exactly
`fake_engines.perf.kv_transfer.kv_transfer`'s time: latency + bytes / bandwidth. Pure and
clock-free: the caller says what time it is.
"""

from __future__ import annotations

from collections.abc import Hashable

from fake_engines.perf.catalogue import LinkSpec

_TOLERANCE_S = 2e-9
"""A transfer with less than this many seconds of full bandwidth left is done: the event queue
keeps time to the nanosecond, so an end time may round a little early."""


class SharedLink:
    """Transfers flowing over one link, each at bandwidth / (number flowing)."""

    def __init__(self, link: LinkSpec) -> None:
        self.link = link
        self.remaining: dict[Hashable, float] = {}
        """Bytes still to move, per flowing transfer, as of `updated_s`."""
        self.updated_s = 0.0
        self.bytes_moved = 0.0
        self.busy_s = 0.0
        """Virtual seconds with at least one transfer flowing."""
        self.peak_flows = 0

    def _advance(self, now_s: float) -> None:
        elapsed = now_s - self.updated_s
        if elapsed > 0 and self.remaining:
            share = self.link.bytes_s * elapsed / len(self.remaining)
            for key in self.remaining:
                self.remaining[key] -= share
            self.busy_s += elapsed
            self.bytes_moved += self.link.bytes_s * elapsed
        self.updated_s = max(self.updated_s, now_s)

    def add(self, key: Hashable, num_bytes: float, now_s: float) -> None:
        """A transfer's bytes start flowing at `now_s` (its latency already waited)."""
        self._advance(now_s)
        self.remaining[key] = num_bytes
        self.peak_flows = max(self.peak_flows, len(self.remaining))

    def next_done_s(self) -> float | None:
        """When the next flowing transfer ends if none is added before; None when idle."""
        if not self.remaining:
            return None
        smallest = max(0.0, min(self.remaining.values()))
        return self.updated_s + smallest * len(self.remaining) / self.link.bytes_s

    def take_done(self, now_s: float) -> list[Hashable]:
        """The transfers whose bytes have all moved by `now_s`, removed, in the order they started."""
        self._advance(now_s)
        done = [key for key, left in self.remaining.items() if left <= self.link.bytes_s * _TOLERANCE_S]
        for key in done:
            del self.remaining[key]
        return done
