"""One publisher's event stream into a KVIndex: sequence numbers, gaps, replay, resync.

Pure and clock-free: the edge (proxy/kv_events.py) owns the sockets and tells an `EventFeed`
what arrived; the feed applies batches to the index in sequence order and answers with the
sequence number to ask the publisher's replay socket for, when a replay is needed.

The rules (vLLM's publisher numbers batches from 0 and keeps the last `buffer_steps` of them
for replay, flotilla/kv_events.py):
- `connected()`: a fresh subscription knows nothing, so it asks for a replay from 0; live
  batches that arrive meanwhile are held and applied after the replay, duplicates dropped.
- a live batch with the next sequence number is applied; one beyond it is a gap: hold it and
  replay from the first missing number.
- a live batch numbered below the next one is a duplicate when the publisher has a replay
  socket (the replay answer and the live stream race, so a live batch may come after the replay
  delivered it); without one it means the publisher restarted (its numbers start at 0 again,
  its cache is empty): clear the backend and start over. With replay a restart shows as a
  dropped connection (`disconnected()`), which the edge sees on its socket.
- a replay whose first batch is beyond the missing number cannot fill the gap (the buffer has
  moved on): clear the backend and resync, i.e. carry on from the first batch there is. The
  index then holds a subset of the engine's cache (blocks stored before the gap come back as
  they are stored again), never a block the engine does not have.
- no replay socket, or a replay that fails: the same clear and resync from the held batches.
- `disconnected()`: clear the backend; the next `connected()` replays from 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from flotilla.kv_events import KVEventBatch
from policies.routing.kv_index import KVIndex

__all__ = ["EventFeed", "FeedStats"]


@dataclass
class FeedStats:
    """Counters of one feed (monotonic; the edge exports them as metrics)."""

    batches: int = 0
    """Batches received, live and replayed."""
    applied: int = 0
    """Batches applied to the index."""
    duplicates: int = 0
    """Batches dropped because they were applied already."""
    gaps: int = 0
    """Live batches that came with sequence numbers missing before them."""
    replays: int = 0
    """Replay requests asked of the publisher."""
    resyncs: int = 0
    """Clears because a gap could not be filled by replay."""
    restarts: int = 0
    """Clears because the publisher's numbers went back (it restarted)."""
    disconnects: int = 0


class EventFeed:
    """Applies one backend's batches to `index`; `can_replay` says whether the publisher has a
    replay socket."""

    def __init__(self, index: KVIndex, backend: str, can_replay: bool = True) -> None:
        self.index = index
        self.backend = backend
        self.can_replay = can_replay
        self.next_seq: int | None = None
        """The sequence number expected next; None before the first batch applied."""
        self.replaying = False
        """A replay was asked for and has not ended: live batches are held."""
        self._held: list[tuple[int, KVEventBatch]] = []
        self.stats = FeedStats()
        index.add_backend(backend)

    def connected(self) -> int | None:
        """The subscription is (re)established: the sequence number to replay from, or None."""
        if not self.can_replay:
            return None
        return self._ask_replay(self.next_seq or 0)

    def live(self, seq: int, batch: KVEventBatch) -> int | None:
        """A batch from the live stream; returns the sequence number to replay from, or None."""
        self.stats.batches += 1
        if self.replaying:
            self._held.append((seq, batch))
            return None
        if self.next_seq is not None and seq < self.next_seq:
            if self.can_replay:
                self.stats.duplicates += 1
                return None
            self.stats.restarts += 1
            self._clear()
        expected = self.next_seq or 0
        if seq == expected or (self.next_seq is None and not self.can_replay):
            self._apply(seq, batch)
            return None
        self.stats.gaps += 1
        if not self.can_replay:
            self._resync()
            self._apply(seq, batch)
            return None
        self._held.append((seq, batch))
        return self._ask_replay(expected)

    def replayed(self, seq: int, batch: KVEventBatch) -> None:
        """A batch from the replay socket's answer."""
        self.stats.batches += 1
        if not self.replaying:
            return
        expected = self.next_seq or 0
        if seq < expected:
            self.stats.duplicates += 1
            return
        if seq > expected:  # the publisher's buffer no longer holds what was missed
            self._resync()
        self._apply(seq, batch)

    def replay_done(self) -> None:
        """The replay answer ended (END_SEQ): apply the held live batches."""
        self.replaying = False
        held, self._held = sorted(self._held, key=lambda item: item[0]), []
        for seq, batch in held:
            if self.next_seq is not None and seq < self.next_seq:
                self.stats.duplicates += 1
                continue
            if self.next_seq is not None and seq > self.next_seq:
                self._resync()
            self._apply(seq, batch)

    def replay_failed(self) -> None:
        """The replay could not be had (timeout, socket error): clear, resync from what is held."""
        if self.next_seq is not None or self._held:
            self._resync()
        self.next_seq = None
        self.replay_done()

    def disconnected(self) -> None:
        """The subscription dropped: what the engine does meanwhile is unseen, so forget it."""
        self.stats.disconnects += 1
        self.replaying = False
        self._held = []
        self._clear()

    def _ask_replay(self, start: int) -> int:
        self.replaying = True
        self.stats.replays += 1
        return start

    def _apply(self, seq: int, batch: KVEventBatch) -> None:
        self.index.apply_batch(self.backend, batch)
        self.next_seq = seq + 1
        self.stats.applied += 1

    def _resync(self) -> None:
        self.stats.resyncs += 1
        self._clear()

    def _clear(self) -> None:
        self.index.clear_backend(self.backend)
        self.next_seq = None
