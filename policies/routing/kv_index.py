"""A KV index fed by the engines' own KV-cache events: which blocks each backend holds now.

Pure and clock-free (no I/O): the proxy (proxy/kv_events.py) and the simulator feed it the same
`flotilla.kv_events` batches, and routing policies ask it for the longest cached prefix of a
request on each backend.

Keying, and why not the engine's hashes. vLLM's block hashes chain from a `NONE_HASH` that is
random per process unless PYTHONHASHSEED is set, and depend on the hash algorithm and on extra
keys (multimodal hashes, cache salt), so in general a router cannot recompute them for a
request. NVIDIA Dynamo's KV router has the same problem and solves it from the events
themselves: `BlockStored` carries the token ids of the blocks it stores, so the router hashes
those tokens with a function of its own, chained through the parent block, and keeps a map
engine hash -> router key per worker to apply `BlockRemoved` (ai-dynamo/dynamo
lib/kv-router/src/radix_tree.rs `RadixTree::apply_event` and protocols.rs
`compute_block_hash_for_seq`, main at commit 4276866, 2026: a radix tree of per-block XXH3
hashes whose path encodes the chain; a store whose parent is unknown is skipped; a removal of
an unknown block is skipped). This index follows that design with the chain folded into the
key: `block_keys` chains `hash((parent_key, block_tokens))` from a root that names the LoRA
adapter, so one key names a whole prefix and a backend's keys form a radix tree stored flat.
The request side then needs only the engine's tokenizer, block size and the adapter name.

Router keys are Python's hash of tuples of ints, which is the same in every process of one
Python build (it does not depend on PYTHONHASHSEED); the adapter name enters as an int taken
from its sha256. They never leave the process: two routers agree because they apply the same
events, not because they share keys.

Scope: blocks on the GPU (`medium` None or "GPU") of KV-cache group 0 (`group_idx` None or 0);
events for CPU offload tiers or other groups are counted and ignored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from flotilla.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVEvent,
    KVEventBatch,
)

__all__ = ["BackendStats", "KVIndex", "KVIndexUser", "block_keys", "lora_root"]

_NO_LORA_ROOT = 0


def lora_root(lora: str | None) -> int:
    """The parent key of a sequence's first block: one per adapter (0 without one), so the same
    tokens under two adapters never share keys, as their KV values differ."""
    if not lora:
        return _NO_LORA_ROOT
    return int.from_bytes(hashlib.sha256(lora.encode()).digest()[:8], "little") or 1


def block_keys(token_ids: Sequence[int], block_size: int, lora: str | None = None,
               parent: int | None = None) -> list[int]:
    """Router keys of the full blocks of `token_ids`, chained from `parent` (None: the start of
    a sequence under `lora`). A partial last block has no key: engines cache full blocks only."""
    if block_size < 1:
        return []
    ids = tuple(token_ids)
    previous = lora_root(lora) if parent is None else parent
    keys: list[int] = []
    append = keys.append
    for start in range(0, len(ids) - block_size + 1, block_size):
        previous = hash((previous, ids[start:start + block_size]))
        append(previous)
    return keys


@dataclass
class BackendStats:
    """What the index did with one backend's events (counters, never reset by a clear)."""

    stored_blocks: int = 0
    removed_blocks: int = 0
    clears: int = 0
    """AllBlocksCleared events, plus clears for reconnects and resyncs."""
    orphan_stores: int = 0
    """BlockStored events skipped because their parent block was unknown (Dynamo's rule)."""
    unknown_removals: int = 0
    """Removed block hashes the index did not hold."""
    ignored_events: int = 0
    """Events for another medium (CPU offload) or another KV-cache group."""


@dataclass
class _Blocks:
    """One backend's cached blocks."""

    count: dict[int, int] = field(default_factory=dict)
    """router key -> engine blocks holding it (two engine hashes can name the same tokens)."""
    by_engine: dict[ExternalBlockHash, int] = field(default_factory=dict)
    """engine block hash -> router key, to apply removals and find parents."""
    block_size: int | None = None
    """Tokens per block, from the newest BlockStored."""
    stats: BackendStats = field(default_factory=BackendStats)

    def add(self, engine_hash: ExternalBlockHash, key: int) -> None:
        old = self.by_engine.get(engine_hash)
        if old == key:
            return
        if old is not None:
            self.drop_key(old)
        self.by_engine[engine_hash] = key
        self.count[key] = self.count.get(key, 0) + 1

    def drop_key(self, key: int) -> None:
        left = self.count[key] - 1
        if left:
            self.count[key] = left
        else:
            del self.count[key]

    def clear(self) -> None:
        self.count.clear()
        self.by_engine.clear()


class KVIndex:
    """Per backend (a string: the proxy uses its URL), the blocks it holds, from its events.

    Feed it with `apply_batch` (or `apply_event`) in sequence order; `clear_backend` on a
    reconnect or an unfillable sequence gap (policies.routing.kv_feed decides when);
    `remove_backend` when a backend leaves. Ask it with `prefix_tokens` / `match`."""

    def __init__(self) -> None:
        self._backends: dict[str, _Blocks] = {}

    # --- membership -----------------------------------------------------------------------
    def add_backend(self, backend: str) -> None:
        """Declare that `backend` publishes events (from now on policies trust the index for
        it, even while it holds nothing)."""
        self._backends.setdefault(backend, _Blocks())

    def remove_backend(self, backend: str) -> None:
        """Forget `backend` entirely (it left the pool)."""
        self._backends.pop(backend, None)

    def tracks(self, backend: str) -> bool:
        """True when `backend` publishes events into this index."""
        return backend in self._backends

    def backends(self) -> list[str]:
        return list(self._backends)

    def clear_backend(self, backend: str) -> None:
        """Forget every block of `backend` (it cleared its cache, reconnected or must resync)."""
        blocks = self._backends.get(backend)
        if blocks is not None:
            blocks.clear()
            blocks.stats.clears += 1

    # --- events -----------------------------------------------------------------------------
    def apply_batch(self, backend: str, batch: KVEventBatch) -> None:
        """Apply one batch's events in order (adds `backend` if new)."""
        for event in batch.events:
            self.apply_event(backend, event)

    def apply_event(self, backend: str, event: KVEvent) -> None:
        blocks = self._backends.setdefault(backend, _Blocks())
        if isinstance(event, BlockStored):
            _store(blocks, event)
        elif isinstance(event, BlockRemoved):
            _remove(blocks, event)
        elif isinstance(event, AllBlocksCleared):
            blocks.clear()
            blocks.stats.clears += 1

    # --- lookups ----------------------------------------------------------------------------
    def block_size(self, backend: str) -> int | None:
        """Tokens per block of `backend`, learned from its events (None before the first store)."""
        blocks = self._backends.get(backend)
        return blocks.block_size if blocks is not None else None

    def match(self, backend: str, keys: Sequence[int]) -> int:
        """How many leading blocks of `keys` (from `block_keys`) `backend` holds."""
        blocks = self._backends.get(backend)
        if blocks is None:
            return 0
        held = blocks.count
        matched = 0
        for key in keys:
            if key not in held:
                break
            matched += 1
        return matched

    def prefix_tokens(self, token_ids: Sequence[int], lora: str | None = None,
                      backends: Iterable[str] | None = None) -> dict[str, int]:
        """Per tracked backend (all, or those of `backends` the index tracks), the length in
        tokens of the longest prefix of `token_ids` it holds in its cache. Keys are computed
        once per block size."""
        names = self._backends if backends is None else [b for b in backends if b in self._backends]
        keys_by_size: dict[int, list[int]] = {}
        out: dict[str, int] = {}
        for name in names:
            size = self._backends[name].block_size
            if size is None:
                out[name] = 0
                continue
            keys = keys_by_size.get(size)
            if keys is None:
                keys = keys_by_size[size] = block_keys(token_ids, size, lora)
            out[name] = self.match(name, keys) * size
        return out

    def engine_hashes(self, backend: str) -> frozenset[ExternalBlockHash]:
        """The engine's own hashes of the blocks the index believes `backend` holds (to compare
        with what the engine reports, e.g. the look-alike's GET /debug/kv_cache)."""
        blocks = self._backends.get(backend)
        return frozenset(blocks.by_engine) if blocks is not None else frozenset()

    def size(self, backend: str) -> int:
        """Blocks `backend` holds, by the index."""
        blocks = self._backends.get(backend)
        return len(blocks.by_engine) if blocks is not None else 0

    def stats(self, backend: str) -> BackendStats:
        blocks = self._backends.get(backend)
        return blocks.stats if blocks is not None else BackendStats()


def _indexed(medium: str | None, group_idx: int | None) -> bool:
    return medium in (None, MEDIUM_GPU) and group_idx in (None, 0)


def _store(blocks: _Blocks, event: BlockStored) -> None:
    if not _indexed(event.medium, event.group_idx):
        blocks.stats.ignored_events += 1
        return
    parent: int | None = None
    if event.parent_block_hash is not None:
        parent = blocks.by_engine.get(event.parent_block_hash)
        if parent is None:  # the chain cannot be followed: skip the store, as Dynamo does
            blocks.stats.orphan_stores += 1
            return
    blocks.block_size = event.block_size
    keys = block_keys(event.token_ids, event.block_size, event.lora_name, parent)
    for engine_hash, key in zip(event.block_hashes, keys, strict=False):
        blocks.add(engine_hash, key)
    blocks.stats.stored_blocks += min(len(keys), len(event.block_hashes))


def _remove(blocks: _Blocks, event: BlockRemoved) -> None:
    if not _indexed(event.medium, event.group_idx):
        blocks.stats.ignored_events += 1
        return
    for engine_hash in event.block_hashes:
        key = blocks.by_engine.pop(engine_hash, None)
        if key is None:
            blocks.stats.unknown_removals += 1
            continue
        blocks.drop_key(key)
        blocks.stats.removed_blocks += 1


class KVIndexUser:
    """Mixin of routing policies that read a KVIndex. Whoever builds the policy (the proxy's
    router, the simulator) calls `bind_kv_index` with the index it feeds, before the first
    `select`; until then `kv_index` is None and the policy works without it."""

    kv_index: KVIndex | None = None

    def bind_kv_index(self, index: KVIndex) -> None:
        self.kv_index = index
