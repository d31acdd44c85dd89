"""A KV-event subscriber written from vLLM's own example, examples/online_serving/kv_events_subscriber.py
(vllm-project/vllm main, 2025-26), not from flotilla.kv_events, so a test decodes the look-alike's
stream the way vLLM's users do.

Two changes from the example, both forced by vLLM 0.32 itself (tests/data/real-engines/vllm/kv-events
is its stream): the example declares `KVCacheEvent` with `array_like=True`, but 0.32's
vllm/distributed/kv_events.py encodes events as tagged maps (decoding the real capture with the
example's structs fails, test_kv_events_reference.py proves it); and the example replays through a
REQ socket, which may take one reply per request while the ROUTER answers with one message per
batch, so this uses a DEALER (the same frames behind an empty delimiter)."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import zmq
from msgspec.msgpack import Decoder


# -- Types copied from the example (which copies them from vllm.distributed.kv_events) ----------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    """Base class for all KV cache-related events (the example adds array_like=True; 0.32 sends maps)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


class ExampleKVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    """The example's base class verbatim, kept to show it cannot read 0.32's stream."""


class ExampleBlockStored(ExampleKVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class ExampleKVEventBatch(EventBatch):
    events: list[ExampleBlockStored]


DECODER = Decoder(type=KVEventBatch)
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class Subscriber:
    """SUB on the publisher's endpoint (connecting to a bound one), DEALER on its replay endpoint."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "kv-events") -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(endpoint)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, topic)
        self.replay_endpoint = replay_endpoint
        self.received: list[tuple[int, KVEventBatch]] = []

    def poll(self, quiet_s: float = 1.0, deadline_s: float = 60.0) -> list[tuple[int, KVEventBatch]]:
        """Receive until `quiet_s` passes without a message (or the deadline); the new (seq, batch)s."""
        new: list[tuple[int, KVEventBatch]] = []
        end, give_up = time.monotonic() + quiet_s, time.monotonic() + deadline_s
        while time.monotonic() < min(end, give_up):
            if self.sub.poll(50):
                topic, seq, payload = self.sub.recv_multipart()
                new.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
                end = time.monotonic() + quiet_s
        self.received += new
        return new

    def wait_for(self, predicate, timeout_s: float = 60.0) -> list[tuple[int, KVEventBatch]]:
        """Receive until the batches received so far satisfy `predicate` (AssertionError at the deadline)."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self.received):
            assert time.monotonic() < deadline, f"no such batch within {timeout_s} s: {self.received!r:.500}"
            if self.sub.poll(100):
                topic, seq, payload = self.sub.recv_multipart()
                self.received.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
        return self.received

    def replay(self, start_seq: int, timeout_s: float = 30.0) -> list[tuple[bytes, int, KVEventBatch]]:
        """Ask the replay socket for every kept batch from start_seq: (topic, seq, batch)s until END_SEQ."""
        assert self.replay_endpoint is not None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart((b"", start_seq.to_bytes(8, "big")))
            answers = []
            while True:
                assert dealer.poll(int(timeout_s * 1000)), "the replay socket did not answer"
                empty, topic, seq, payload = dealer.recv_multipart()
                assert empty == b""
                if seq == END_SEQ:
                    assert topic == b"" and payload == b""
                    return answers
                answers.append((topic, int.from_bytes(seq, "big"), DECODER.decode(payload)))
        finally:
            dealer.close(linger=0)

    def close(self) -> None:
        self.sub.close(linger=0)
        self.ctx.term()
