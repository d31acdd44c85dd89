"""vLLM's KV-cache event wire format: the one definition the look-alike engine publishes with and
the router's and the simulator's KV index read.

Followed: vLLM 0.32.0, `vllm/distributed/kv_events.py` (`EventBatch`, `KVEventBatch`,
`BlockStored`, `BlockRemoved`, `AllBlocksCleared`, `ZmqEventPublisher`) and
`vllm/v1/core/kv_cache_utils.py` (`maybe_convert_block_hash`). Field names, field order, the
`array_like` batch, the tagged events and `omit_defaults` are theirs, so msgspec's msgpack encoding
gives the same bytes; tests/data/real-engines/vllm/kv-events holds a real engine's stream.

On the wire a ZMQ multipart message is three frames: the topic (utf-8), the sequence number
(8 bytes, big-endian, from 0 per publisher) and the msgpack payload. The replay socket (ROUTER)
takes an 8-byte big-endian start sequence (a DEALER sends `[b"", start]`) and answers
`[b"", topic, seq, payload]` per buffered batch from that sequence on, then `[b"", b"", END_SEQ, b""]`.
"""

from __future__ import annotations

from typing import Any

import msgspec

ExternalBlockHash = bytes | int
"""A block hash as published: vLLM 0.32 sends the low 64 bits of its sha256 digest as an int
(`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, default on); bytes are accepted on decode."""

MEDIUM_GPU = "GPU"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""Sequence frame that ends a replay answer."""


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    """Base of the three event kinds; the msgpack map carries `type` = the class name."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(EventBatch):
    events: list[KVEvent]  # type: ignore[assignment]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    """The msgpack payload frame of one batch."""
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """One payload frame; msgspec.DecodeError (a ValueError) on anything else."""
    return _DECODER.decode(payload)


def external_block_hash(block_hash: bytes | int) -> int:
    """The published form of an engine's block hash: vLLM's `maybe_convert_block_hash`, the low
    64 bits of a digest read big-endian; an int hash (the builtin algorithm) to 64 bits too."""
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)
    return block_hash & ((1 << 64) - 1)


def seq_bytes(seq: int) -> bytes:
    """A sequence number frame."""
    return seq.to_bytes(8, "big", signed=True)


def seq_from_bytes(frame: bytes) -> int:
    """The sequence number of a frame (ValueError unless 8 bytes)."""
    if len(frame) != 8:
        raise ValueError(f"sequence frame of {len(frame)} bytes, expected 8")
    return int.from_bytes(frame, "big", signed=True)
