"""vLLM's ZMQ KV-event publisher (vllm/distributed/kv_events.py `ZmqEventPublisher`, 0.32.0).

Every step that changed the KV cache becomes one `KVEventBatch` (ts = wall time now, the events,
the data-parallel rank) sent on a PUB socket as three frames: the topic, the sequence number
(8 bytes big-endian, from 0) and the msgpack payload. The last `buffer_steps` payloads are kept:
a ROUTER socket on `replay_endpoint` takes `[identity, b"", start_seq]` and answers
`[identity, b"", topic, seq, payload]` for each kept batch from start_seq on, then
`[identity, b"", b"", END_SEQ, b""]`.

vLLM publishes from a thread fed by a queue of `max_queue_size`; here the engine steps on the
asyncio loop, so a batch is encoded and handed to ZMQ there at once (a PUB send never blocks:
past `hwm` ZMQ drops) and the replay socket is served by a task on the same loop. The wall
clock is read only here, at the edge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque

import zmq
import zmq.asyncio

from fake_engines.factory.vllm_config import KVEventsConfig, ServeConfigError, offset_endpoint_port
from flotilla.kv_events import END_SEQ, KVEvent, KVEventBatch, encode_batch, seq_bytes

log = logging.getLogger("fake_engines.vllm.kv_events")


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule: a wildcard host (`*`, `::`) or an ipc:// / inproc:// address binds; a named host connects."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqKvEventPublisher:
    """One data-parallel rank's publisher; sockets are bound (or connected) on construction."""

    def __init__(self, config: KVEventsConfig, data_parallel_rank: int = 0) -> None:
        self.data_parallel_rank = data_parallel_rank
        self.endpoint = offset_endpoint_port(config.endpoint, data_parallel_rank) or config.endpoint
        self.replay_endpoint = offset_endpoint_port(config.replay_endpoint, data_parallel_rank)
        self._topic = config.topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._next_seq = 0
        self._ctx = zmq.Context()
        self._actx = zmq.asyncio.Context.shadow(self._ctx.underlying)
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task | None = None
        try:
            self.endpoint = self._attach(self._pub, self.endpoint, bind=is_bind_endpoint(self.endpoint))
            if self.replay_endpoint is not None:
                self._replay = self._actx.socket(zmq.ROUTER)
                self.replay_endpoint = self._attach(self._replay, self.replay_endpoint, bind=True)
        except ServeConfigError:
            self.close_sockets()
            raise
        log.info("publishing KV cache events on %s%s", self.endpoint,
                 f", replay on {self.replay_endpoint}" if self.replay_endpoint else "")

    @staticmethod
    def _attach(sock: zmq.Socket, endpoint: str, bind: bool) -> str:
        """Bind or connect; the endpoint actually bound (a port 0 resolved). A ZMQ refusal (port
        in use, bad address) is a ServeConfigError naming the endpoint, one line."""
        try:
            if not bind:
                sock.connect(endpoint)
                return endpoint
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            raise ServeConfigError(f"--kv-events-config: cannot {'bind' if bind else 'connect'} "
                                   f"{endpoint}: {exc.strerror}") from None
        return sock.getsockopt_string(zmq.LAST_ENDPOINT) or endpoint

    @property
    def next_seq(self) -> int:
        """The sequence number the next batch gets (batches published so far)."""
        return self._next_seq

    def publish(self, events: list[KVEvent]) -> None:
        """Send one step's events as a batch stamped with the wall time now, and keep it for replay."""
        batch = KVEventBatch(ts=time.time(), events=events, data_parallel_rank=self.data_parallel_rank)
        payload = encode_batch(batch)
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        try:
            self._pub.send_multipart((self._topic, seq_bytes(seq), payload), flags=zmq.NOBLOCK)
        except zmq.Again:  # a connecting PUB whose peer is not there yet: the batch is lost, as in vLLM
            log.debug("KV event batch %d dropped: no peer ready", seq)
        self._buffer.append((seq, payload))

    def start(self) -> None:
        """Serve replay requests on the running loop (no-op without a replay endpoint)."""
        if self._replay is not None and self._replay_task is None:
            self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                log.warning("invalid KV event replay request: %d frames", len(frames))
                continue
            client, _, start = frames
            await self._answer_replay(client, int.from_bytes(start, "big"))

    async def _answer_replay(self, client: bytes, start_seq: int) -> None:
        assert self._replay is not None
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                await self._replay.send_multipart((client, b"", self._topic, seq_bytes(seq), payload))
        await self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    async def close(self) -> None:
        """Stop serving replay and close the sockets at once (linger 0, as vLLM's shutdown)."""
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
            self._replay_task = None
        self.close_sockets()

    def close_sockets(self) -> None:
        """Close both sockets and the context; safe to call twice."""
        if self._replay is not None:
            self._replay.close(linger=0)
        self._pub.close(linger=0)
        if not self._ctx.closed:
            self._ctx.term()
