"""Paged KV blocks: the free queue (LRU eviction order) and the hash -> cached block map.

Only `KVCacheManager` calls `BlockPool`; only the pool touches `FreeBlockQueue` and `KVCacheBlock`.
"""

from __future__ import annotations

import array
import functools
import hashlib
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from flotilla.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, KVEvent, external_block_hash

NONE_HASH = hashlib.sha256(b"flotilla-kv-none-hash").digest()
"""Parent hash of a sequence's first block. Fixed, so routers can compute the same chain."""

BlockHash = bytes | int
"""A full block's key: a sha256 digest, or an int with the builtin algorithm."""


def _adapter_tag(lora: str | None) -> bytes:
    # the adapter is part of the key: the same tokens under another LoRA give other KV values
    return b"\x00" if lora is None else b"\x01" + lora.encode()


def hash_block_tokens(parent_hash: bytes | None, token_ids: tuple[int, ...], lora: str | None) -> bytes:
    """Chained hash of one full block: sha256 over the parent hash, the block's token ids (as
    little-endian 32-bit integers) and the adapter."""
    payload = np.asarray(token_ids, dtype="<u4").tobytes() + _adapter_tag(lora)
    return hashlib.sha256((parent_hash or NONE_HASH) + payload).digest()


_NATIVE_U32 = array.array("I").itemsize == 4 and sys.byteorder == "little"


def _pack_u32(token_ids: list[int]) -> bytes:
    """Token ids as little-endian 32-bit integers (array's native 'I' packs a list about twice
    as fast as numpy where it has that layout; both raise OverflowError outside 0 .. 2**32 - 1)."""
    if _NATIVE_U32:
        return array.array("I", token_ids).tobytes()
    return np.asarray(token_ids, dtype="<u4").tobytes()


def _sha256_chain(parent_hash: BlockHash | None, token_ids: list[int], block_size: int,
                  lora: str | None) -> list[BlockHash]:
    # the ids are packed once and sliced per block, which keeps long prompts cheap to hash
    full = len(token_ids) - len(token_ids) % block_size
    packed = _pack_u32(token_ids[:full])
    tag, step = _adapter_tag(lora), 4 * block_size
    parent = cast(bytes, parent_hash or NONE_HASH)  # this algorithm's parents are digests
    sha256 = hashlib.sha256
    hashes: list[BlockHash] = []
    append = hashes.append
    # each block's payload (its ids and the adapter tag) cut in one pass; the chain is the only serial part
    for payload in [packed[start:start + step] + tag for start in range(0, len(packed), step)]:
        parent = sha256(parent + payload).digest()
        append(parent)
    return hashes


BUILTIN_NONE_HASH = int.from_bytes(NONE_HASH[:8], "little")
"""`NONE_HASH` of the builtin algorithm: fixed, unlike vLLM's random one, so runs replay exactly."""


@functools.lru_cache(maxsize=256)
def _adapter_key(lora: str | None) -> int | None:
    # str hashes change with PYTHONHASHSEED; an int from the name keeps the chain the same every run
    return None if lora is None else int.from_bytes(hashlib.sha256(lora.encode()).digest()[:8], "little")


def _builtin_chain(parent_hash: BlockHash | None, token_ids: list[int], block_size: int,
                   lora: str | None) -> list[BlockHash]:
    # vLLM's `builtin` algorithm: hash((parent, tuple(block token ids), extra keys)); tuples of
    # ints hash the same in every process, and the blocks are cut from one tuple of the ids
    full = len(token_ids) - len(token_ids) % block_size
    ids = tuple(token_ids[:full] if full < len(token_ids) else token_ids)
    extra = _adapter_key(lora)
    parent = BUILTIN_NONE_HASH if parent_hash is None else parent_hash
    hashes: list[BlockHash] = []
    append = hashes.append
    for start in range(0, full, block_size):
        parent = hash((parent, ids[start:start + block_size], extra))
        append(parent)
    return hashes


HASH_ALGOS: dict[str, Callable[[BlockHash | None, list[int], int, str | None], list[BlockHash]]] = {
    "sha256": _sha256_chain,
    "builtin": _builtin_chain,
}
"""`--prefix-caching-hash-algo` values. sha256 (vLLM's default) keys blocks by 32-byte digests
that agree across processes; builtin (vLLM's earlier default) by Python's 64-bit tuple hash,
about twice as fast and, with 2**64 keys, as good for one engine's own cache."""


def hash_block_chain(parent_hash: BlockHash | None, token_ids: list[int], block_size: int,
                     lora: str | None, algo: str = "sha256") -> list[BlockHash]:
    """The chained hash of each full block of `token_ids`, from `parent_hash` (None: the start
    of a sequence); with sha256, each is `hash_block_tokens` of its block."""
    return HASH_ALGOS[algo](parent_hash, token_ids, block_size, lora)


@dataclass(slots=True, eq=False)  # hundreds of thousands per fleet, touched on every block taken or freed
class KVCacheBlock:
    """One KV block of block_size token slots."""

    block_id: int
    """Index in the pool, 0 .. num_gpu_blocks - 1; 0 is the null block and never handed out."""
    ref_cnt: int = 0
    """Live requests using the block; 0 means it sits in the free queue."""
    block_hash: BlockHash | None = None
    """Hash of the full block's contents, kept after freeing until the block is evicted."""
    prev_free: KVCacheBlock | None = field(default=None, repr=False)
    """Neighbours in the free queue while the block is free; stale once it is taken."""
    next_free: KVCacheBlock | None = field(default=None, repr=False)


class FreeBlockQueue:
    """Unreferenced blocks, least recently freed first: vLLM's doubly linked list threaded
    through the blocks themselves, so taking a run of blocks from the front relinks only its
    ends, and a cache hit leaves from the middle in O(1)."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self._head, self._tail = KVCacheBlock(-1), KVCacheBlock(-1)  # sentinels: no empty-list cases
        self._head.next_free, self._tail.prev_free = self._tail, self._head
        self.num_free_blocks = 0
        self.extend(blocks)

    def __len__(self) -> int:
        return self.num_free_blocks

    def take(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take the `num_blocks` least recently freed blocks, oldest first (at most len(self))."""
        taken: list[KVCacheBlock] = []
        append = taken.append
        block = self._head.next_free
        for _ in range(num_blocks):
            append(block)  # type: ignore[arg-type]
            block = block.next_free  # type: ignore[union-attr]
        self._head.next_free = block
        block.prev_free = self._head  # type: ignore[union-attr]
        self.num_free_blocks -= num_blocks
        return taken

    def extend(self, blocks: list[KVCacheBlock]) -> None:
        """Append just-freed blocks at the most recently used end, in this order."""
        last = self._tail.prev_free
        for block in blocks:
            last.next_free = block  # type: ignore[union-attr]
            block.prev_free = last
            last = block
        last.next_free = self._tail  # type: ignore[union-attr]
        self._tail.prev_free = last
        self.num_free_blocks += len(blocks)

    def prepend(self, blocks: list[KVCacheBlock]) -> None:
        """Put just-freed blocks at the front, in this order: they are taken first."""
        if not blocks:
            return
        first = self._head.next_free
        prev = self._head
        for block in blocks:
            block.prev_free = prev
            prev.next_free = block
            prev = block
        prev.next_free = first
        first.prev_free = prev  # type: ignore[union-attr]
        self.num_free_blocks += len(blocks)

    def remove(self, block: KVCacheBlock) -> None:
        """Take a cached block out because a request reuses it."""
        before, after = block.prev_free, block.next_free
        before.next_free = after  # type: ignore[union-attr]
        after.prev_free = before  # type: ignore[union-attr]
        self.num_free_blocks -= 1

    def block_ids(self) -> list[int]:
        """Block ids in eviction order (next to be evicted first)."""
        ids, block = [], self._head.next_free
        while block is not self._tail:
            ids.append(block.block_id)  # type: ignore[union-attr]
            block = block.next_free  # type: ignore[union-attr]
        return ids


class BlockPool:
    """All KV blocks of one engine, with prefix-cache bookkeeping."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, enable_kv_cache_events: bool = False) -> None:
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.enable_caching = enable_caching
        # Block 0 is vLLM's null block: it is never free, so usage is out of num_gpu_blocks - 1.
        self.free_block_queue = FreeBlockQueue(self.blocks[1:])
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock] = {}
        """Hash -> the block a lookup finds: of several blocks with the same contents, the one
        cached first that is still cached (vLLM's `BlockHashToBlockMap.get_one_block`)."""
        self._duplicates: dict[BlockHash, dict[int, KVCacheBlock]] = {}
        """Hash -> every block caching it, in caching order, for hashes cached in more than one
        block: vLLM does not de-duplicate (block tables are append-only), so evicting one copy
        leaves the others findable."""
        self.kv_event_queue: list[KVEvent] | None = [] if enable_kv_cache_events else None
        """vLLM's `kv_event_queue`: events since the last `take_events`; None when events are off,
        so the hot paths test one local for None and build nothing."""

    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can hold tokens (all but the null block)."""
        return len(self.blocks) - 1

    def get_num_free_blocks(self) -> int:
        """Blocks no live request references, cached ones included."""
        return len(self.free_block_queue)

    def get_usage(self) -> float:
        """Fraction of usable blocks referenced by live requests."""
        return 1.0 - self.get_num_free_blocks() / self.num_usable_blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """The block holding these contents, if still cached."""
        return self.cached_block_hash_to_block.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take blocks from the LRU end, evicting their cached contents; ValueError if too few are free."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"cannot get {num_blocks} free blocks from the pool")
        taken = self.free_block_queue.take(num_blocks)
        cached = self.cached_block_hash_to_block
        duplicates = self._duplicates
        events = self.kv_event_queue
        for block in taken:
            block_hash = block.block_hash
            if block_hash is not None:  # evict this copy; another copy of the contents stays findable
                if duplicates and block_hash in duplicates:
                    self._evict_duplicate(block, block_hash)
                elif cached.get(block_hash) is block:
                    del cached[block_hash]
                block.block_hash = None
                if events is not None:  # vLLM: one BlockRemoved per evicted (hash, block), duplicates too
                    events.append(BlockRemoved([external_block_hash(block_hash)], MEDIUM_GPU, group_idx=0))
            block.ref_cnt = 1
        return taken

    def _evict_duplicate(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        copies = self._duplicates[block_hash]
        copies.pop(block.block_id, None)
        first = next(iter(copies.values()))
        self.cached_block_hash_to_block[block_hash] = first
        if len(copies) == 1:
            del self._duplicates[block_hash]

    def _insert(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        """Cache one more block under the hash (vLLM's `BlockHashToBlockMap.insert`)."""
        cached = self.cached_block_hash_to_block
        first = cached.get(block_hash)
        if first is None:
            cached[block_hash] = block
            return
        copies = self._duplicates.get(block_hash)
        if copies is None:
            self._duplicates[block_hash] = {first.block_id: first, block.block_id: block}
        else:
            copies[block.block_id] = block

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Add a reference to cache-hit blocks, taking free ones out of the eviction queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def cache_full_block(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        """Record a newly full block's hash; the first block with given contents stays the one found."""
        if not self.enable_caching or block.block_hash is not None:
            return
        block.block_hash = block_hash
        self._insert(block, block_hash)

    def cache_full_blocks(self, blocks: list[KVCacheBlock], block_hashes: list[BlockHash]) -> None:
        """`cache_full_block` of each block with its hash, in order."""
        if not self.enable_caching:
            return
        cached = self.cached_block_hash_to_block
        for block, block_hash in zip(blocks, block_hashes, strict=True):
            if block.block_hash is None:
                block.block_hash = block_hash
                if block_hash in cached:
                    self._insert(block, block_hash)
                else:
                    cached[block_hash] = block

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block (ordered by eviction priority). As vLLM's
        `BlockPool.free_blocks`: blocks reaching 0 without a hash (partial tails, or any block
        without prefix caching) go to the front of the free queue, to be reused first; cached
        blocks to the back, in this order, for LRU eviction."""
        reuse_first, evict_last = [], []
        caching = self.enable_caching
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if not block.ref_cnt:
                if block.block_hash is None or not caching:
                    reuse_first.append(block)
                else:
                    evict_last.append(block)
        self.free_block_queue.prepend(reuse_first)
        self.free_block_queue.extend(evict_last)

    def reset_prefix_cache(self) -> bool:
        """vLLM's `reset_prefix_cache`: forget every cached hash, only while no block is in use
        (False, nothing changed, otherwise); queues `AllBlocksCleared`."""
        if self.get_num_free_blocks() != self.num_usable_blocks:
            return False
        self.cached_block_hash_to_block.clear()
        self._duplicates.clear()
        for block in self.blocks:
            block.block_hash = None
        if self.kv_event_queue is not None:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVEvent]:
        """The queued KV events, oldest first, and an empty queue; [] when events are off."""
        events = self.kv_event_queue
        if not events:
            return []
        self.kv_event_queue = []
        return events

    def cached_block_hashes(self) -> list[BlockHash]:
        """The hash of every block that holds one, a duplicate copy once per block: what the
        published events add up to (a hash stays cached while any block holding it is not evicted)."""
        return [block.block_hash for block in self.blocks if block.block_hash is not None]
