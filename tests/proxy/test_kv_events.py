"""The proxy's KV-event subscriptions against a publisher speaking vLLM 0.32's ZMQ protocol
(PUB frames topic/seq/payload, ROUTER replay answering [id, b"", topic, seq, payload] per
buffered batch then END_SEQ), on real 127.0.0.1 sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
import zmq
import zmq.asyncio

from flotilla.kv_events import END_SEQ, BlockStored, KVEventBatch, encode_batch, seq_bytes
from policies.routing.kv_index import KVIndex
from proxy.config import BackendSpec, KVEventsSource
from proxy.kv_events import KVEventsHub
from proxy.metrics import RouterMetrics
from proxy.pool import BackendPool
from tests.waiting import wait_until

URL = "http://127.0.0.1:9"
TOPIC = "kv"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def store(n: int) -> KVEventBatch:
    """A batch storing block `n` (engine hash 1000 + n) as a first block."""
    event = BlockStored(block_hashes=[1000 + n], parent_block_hash=None, token_ids=[n, n], block_size=2,
                        lora_id=None, medium="GPU", lora_name=None)
    return KVEventBatch(ts=float(n), events=[event])


class Publisher:
    """vLLM's ZmqEventPublisher protocol, driven by the test: `send` publishes and buffers a
    batch, `lose` buffers it without publishing (a dropped message)."""

    def __init__(self, pub_port: int, replay_port: int) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(f"tcp://127.0.0.1:{pub_port}")
        self.replay = self.ctx.socket(zmq.ROUTER)
        self.replay.bind(f"tcp://127.0.0.1:{replay_port}")
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.keep_from = 0
        """Replay only batches numbered from here (an older buffer has moved on)."""
        self._task = asyncio.create_task(self._serve_replay())

    async def send(self, payload: KVEventBatch | bytes, publish: bool = True) -> None:
        data = payload if isinstance(payload, bytes) else encode_batch(payload)
        if publish:
            await self.pub.send_multipart([TOPIC.encode(), seq_bytes(self.seq), data])
        self.buffer.append((self.seq, data))
        self.seq += 1

    async def lose(self, batch: KVEventBatch) -> None:
        await self.send(batch, publish=False)

    async def _serve_replay(self) -> None:
        while True:
            client, _, start = await self.replay.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, data in self.buffer:
                if seq >= max(first, self.keep_from):
                    await self.replay.send_multipart([client, b"", TOPIC.encode(), seq_bytes(seq), data])
            await self.replay.send_multipart([client, b"", b"", END_SEQ, b""])

    async def close(self) -> None:
        if self.ctx.closed:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.pub.close(linger=0)
        self.replay.close(linger=0)
        self.ctx.term()


@pytest.fixture
async def setup():
    pub_port, replay_port = free_port(), free_port()
    publisher = Publisher(pub_port, replay_port)
    source = KVEventsSource(endpoint=f"tcp://127.0.0.1:{pub_port}", replay_endpoint=f"tcp://127.0.0.1:{replay_port}",
                            topic=TOPIC)
    pool = BackendPool()
    pool.add(BackendSpec(url=URL, flavor="vllm", kv_events=source))
    index = KVIndex()
    hub = KVEventsHub(pool, index, sync_interval_s=0.05)
    task = asyncio.create_task(hub.run())
    yield publisher, hub, index, pool
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await hub.stop()
    await publisher.close()


def held(index: KVIndex) -> set[int]:
    return {h - 1000 for h in index.engine_hashes(URL)}


async def test_batches_published_before_the_subscription_come_by_replay_and_later_ones_live(setup):
    publisher, hub, index, _ = setup
    await publisher.send(store(0))  # no subscriber has connected yet: only the replay has it
    await wait_until(lambda: held(index) == {0}, what="the replay at connect")
    for n in (1, 2):
        await publisher.send(store(n))
    await wait_until(lambda: held(index) == {0, 1, 2}, what="live batches")
    assert hub.subscribers[URL].feed.stats.resyncs == 0


async def test_a_lost_batch_is_replayed(setup):
    publisher, hub, index, _ = setup
    await wait_until(lambda: URL in hub.subscribers and hub.subscribers[URL].feed.stats.replays >= 1)
    await publisher.send(store(0))
    await wait_until(lambda: held(index) == {0})
    await publisher.lose(store(1))
    await publisher.send(store(2))
    await wait_until(lambda: held(index) == {0, 1, 2}, what="the gap filled by replay")
    stats = hub.subscribers[URL].feed.stats
    assert stats.gaps == 1 and stats.resyncs == 0


async def test_a_gap_the_buffer_no_longer_holds_clears_and_resyncs(setup):
    publisher, hub, index, _ = setup
    await publisher.send(store(0))
    await wait_until(lambda: held(index) == {0})
    await publisher.lose(store(1))
    publisher.keep_from = 2
    await publisher.send(store(2))
    await wait_until(lambda: hub.subscribers[URL].feed.stats.resyncs == 1, what="a resync")
    assert held(index) == {2}


async def test_a_bad_payload_is_counted_and_dropped_and_the_stream_goes_on(setup):
    publisher, hub, index, _ = setup
    await publisher.send(store(0))
    await wait_until(lambda: held(index) == {0})
    await publisher.pub.send_multipart([TOPIC.encode(), b"\x00"])  # no payload frame
    await publisher.send(b"\xc1 not msgpack")
    await publisher.send(store(2))
    await wait_until(lambda: hub.subscribers[URL].bad_payloads >= 2, what="bad payloads counted")
    await wait_until(lambda: 2 in held(index), what="the stream after them")


async def test_a_backend_that_leaves_the_pool_leaves_the_index(setup):
    publisher, hub, index, pool = setup
    await publisher.send(store(0))
    await wait_until(lambda: held(index) == {0})
    pool.drain(URL)
    await wait_until(lambda: not index.tracks(URL), what="the index forgetting the backend")
    assert URL not in hub.subscribers


async def test_a_restarted_publisher_is_seen_as_a_reconnect_and_the_index_rebuilt(setup):
    publisher, hub, index, _ = setup
    await publisher.send(store(0))
    await publisher.send(store(1))
    await wait_until(lambda: held(index) == {0, 1})
    source = hub.subscribers[URL].source
    await publisher.close()
    await wait_until(lambda: held(index) == set(), what="the drop clearing the index")
    pub_port = int(source.endpoint.rsplit(":", 1)[1])
    replay_port = int((source.replay_endpoint or "").rsplit(":", 1)[1])
    restarted = Publisher(pub_port, replay_port)  # numbers from 0 again, an empty cache
    try:
        await restarted.send(store(7))
        await wait_until(lambda: held(index) == {7}, what="the restarted engine's blocks")
    finally:
        await restarted.close()


async def test_the_event_counters_are_exported_under_flotilla(setup):
    publisher, hub, index, _ = setup
    metrics = RouterMetrics()
    hub.register_metrics(metrics.registry)
    await publisher.send(store(0))
    await wait_until(lambda: held(index) == {0})
    text = metrics.exposition().decode()
    assert f'flotilla_kv_event_batches_total{{backend="{URL}"}}' in text
    assert f'flotilla_kv_index_blocks{{backend="{URL}"}} 1.0' in text
    for name in ("gaps", "replays", "resyncs", "bad_payloads", "disconnects"):
        assert f"flotilla_kv_event_{name}_total" in text
