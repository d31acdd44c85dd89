"""The edge of the KV index: ZMQ subscriptions to every backend that publishes KV-cache events.

Per backend whose spec names a `kv_events` source: a SUB socket (zmq.asyncio) on its endpoint
and topic, a socket monitor for (re)connects and drops, and a DEALER to its replay endpoint
when a replay is asked for. What to do with each batch (apply, hold, replay, resync) is
`policies.routing.kv_feed.EventFeed`'s pure decision; the index is `policies.routing.kv_index`.
A payload that does not decode is counted and dropped; nothing a publisher sends can raise out
of here. Backends that leave the pool lose their subscription and their index entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from zmq.utils.monitor import parse_monitor_message

from flotilla.kv_events import END_SEQ, KVEventBatch, decode_batch, seq_bytes, seq_from_bytes
from policies.routing.kv_feed import EventFeed
from policies.routing.kv_index import KVIndex
from proxy.config import KVEventsSource
from proxy.pool import BackendPool

log = logging.getLogger(__name__)

REPLAY_TIMEOUT_S = 5.0
"""Longest wait for the next frame of a replay answer before the replay counts as failed."""


def parse_frames(frames: list[bytes]) -> tuple[int, KVEventBatch]:
    """(seq, batch) of a live message [topic, seq, payload] or a replayed one (its last two
    frames); ValueError for anything else (msgspec's DecodeError is one)."""
    if len(frames) < 2:
        raise ValueError(f"{len(frames)} frames, expected at least 2")
    return seq_from_bytes(frames[-2]), decode_batch(frames[-1])


class Subscriber:
    """One backend's subscription, feeding `feed`."""

    def __init__(self, ctx: zmq.asyncio.Context, url: str, source: KVEventsSource, index: KVIndex) -> None:
        self.ctx = ctx
        self.url = url
        self.source = source
        self.feed = EventFeed(index, url, can_replay=source.replay_endpoint is not None)
        self.bad_payloads = 0
        self._replay: asyncio.Task | None = None

    async def run(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        try:
            sub.connect(self.source.endpoint)
            await asyncio.gather(self._read(sub), self._watch(monitor))
        finally:
            if self._replay is not None:
                self._replay.cancel()
            with contextlib.suppress(zmq.ZMQError):
                sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _read(self, sub: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sub.recv_multipart()
            try:
                seq, batch = parse_frames(frames)
            except ValueError:
                self.bad_payloads += 1
                continue
            self._replay_from(self.feed.live(seq, batch))

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())["event"]
            if event == zmq.EVENT_CONNECTED:
                self._replay_from(self.feed.connected())
            elif event == zmq.EVENT_DISCONNECTED:
                if self._replay is not None:
                    self._replay.cancel()
                self.feed.disconnected()

    def _replay_from(self, start: int | None) -> None:
        if start is None or (self._replay is not None and not self._replay.done()):
            return
        self._replay = asyncio.create_task(self._run_replay(start))

    async def _run_replay(self, start: int) -> None:
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(self.source.replay_endpoint or "")
            await dealer.send_multipart([b"", seq_bytes(start)])
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT_S)
                if len(frames) >= 2 and frames[-2] == END_SEQ:
                    break
                try:
                    seq, batch = parse_frames(frames)
                except ValueError:
                    self.bad_payloads += 1
                    continue
                self.feed.replayed(seq, batch)
            self.feed.replay_done()
        except (TimeoutError, zmq.ZMQError) as exc:
            log.warning("KV event replay from %s failed (%s): resyncing", self.source.replay_endpoint, exc)
            self.feed.replay_failed()
        finally:
            dealer.close(linger=0)


class KVEventsHub:
    """Keeps one Subscriber per pool backend that names a `kv_events` source, all feeding `index`."""

    def __init__(self, pool: BackendPool, index: KVIndex, sync_interval_s: float = 0.5) -> None:
        self.pool = pool
        self.index = index
        self.sync_interval_s = sync_interval_s
        self.ctx = zmq.asyncio.Context()
        self.subscribers: dict[str, Subscriber] = {}
        self._tasks: dict[str, asyncio.Task] = {}

    def sync(self) -> None:
        """Subscribe to new publishers, drop backends that left (their index entries too)."""
        wanted = {b.url: b.spec.kv_events for b in self.pool if b.spec.kv_events is not None}
        for url in [u for u, s in self.subscribers.items() if wanted.get(u) != s.source]:
            self._drop(url)
        for url, source in wanted.items():
            if url not in self.subscribers and source is not None:
                sub = self.subscribers[url] = Subscriber(self.ctx, url, source, self.index)
                self._tasks[url] = asyncio.create_task(sub.run())

    def _drop(self, url: str) -> None:
        self.subscribers.pop(url, None)
        task = self._tasks.pop(url, None)
        if task is not None:
            task.cancel()
        self.index.remove_backend(url)

    async def run(self) -> None:
        while True:
            self.sync()
            await asyncio.sleep(self.sync_interval_s)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for url in list(self.subscribers):
            self._drop(url)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.ctx.term()

    def register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(_Collector(self))


class _Collector:
    """flotilla_kv_event_* counters and the index size, read from the feeds at scrape time."""

    def __init__(self, hub: KVEventsHub) -> None:
        self.hub = hub

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        counters = {
            "batches": ("Batches of KV-cache events received, live and replayed", lambda s: s.feed.stats.batches),
            "gaps": ("Live batches that came after missing sequence numbers", lambda s: s.feed.stats.gaps),
            "replays": ("Replays asked of the publisher", lambda s: s.feed.stats.replays),
            "resyncs": ("Index clears because a gap could not be replayed", lambda s: s.feed.stats.resyncs),
            "disconnects": ("Subscriptions dropped (the backend's index entries are cleared)",
                            lambda s: s.feed.stats.disconnects),
            "bad_payloads": ("Event messages that did not decode (dropped)", lambda s: s.bad_payloads),
        }
        subs = list(self.hub.subscribers.values())
        for name, (doc, read) in counters.items():
            family = CounterMetricFamily(f"flotilla_kv_event_{name}", doc, labels=["backend"])
            for sub in subs:
                family.add_metric([sub.url], read(sub))
            yield family
        blocks = GaugeMetricFamily("flotilla_kv_index_blocks", "KV blocks each backend holds, by the router's index",
                                   labels=["backend"])
        for sub in subs:
            blocks.add_metric([sub.url], self.hub.index.size(sub.url))
        yield blocks
