"""The scheduler's view of the KV cache: per-request block tables on top of `BlockPool`."""

from __future__ import annotations

from dataclasses import dataclass

from fake_engines.core._block_pool import HASH_ALGOS, BlockHash, BlockPool, KVCacheBlock
from fake_engines.core._request import EngineRequest
from flotilla.kv_events import MEDIUM_GPU, BlockStored, KVEvent, external_block_hash

KV_CACHE_SPEC_KIND = "full_attention"
"""vLLM's `kv_cache_spec_kind` of the one KV cache group (group 0) of a plain decoder."""


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups so far, in tokens."""

    queries: int = 0
    """Prompt tokens of the requests admitted for the first time (vLLM counts a lookup at
    admission only, and a preempted request's apart, in its preempted_* fields)."""
    hits: int = 0
    """Of those, tokens found cached."""


class KVCacheManager:
    """Allocates, shares and frees the KV blocks of requests; the scheduler's only door to the pool."""

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_caching: bool,
                 hash_algo: str = "sha256", enable_kv_cache_events: bool = False) -> None:
        self.block_size = block_size
        self._hash_chain = HASH_ALGOS[hash_algo]
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching, enable_kv_cache_events)
        self.lora_ids: dict[str, int] = {}
        """Adapter name -> vLLM's `lora_int_id` (1, 2, ... in order of registration or first use)."""
        self.prefix_cache_stats = PrefixCacheStats()
        self._req_blocks: dict[str, list[KVCacheBlock]] = {}
        self._num_cached_blocks: dict[str, int] = {}
        self._req_block_hashes: dict[str, list[BlockHash]] = {}

    @property
    def usage(self) -> float:
        """Fraction of usable blocks referenced by live requests, in [0, 1]."""
        return self.block_pool.get_usage()

    @property
    def num_usable_blocks(self) -> int:
        """Blocks a request may hold: all but the null block."""
        return self.block_pool.num_usable_blocks

    def get_num_free_blocks(self) -> int:
        """Blocks that can be taken now (free, or cached but unreferenced)."""
        return self.block_pool.get_num_free_blocks()

    def usage_after(self, num_new_blocks: int) -> float:
        """`usage` once `num_new_blocks` more free blocks are taken."""
        pool = self.block_pool
        return 1.0 - (pool.get_num_free_blocks() - num_new_blocks) / pool.num_usable_blocks

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table (block ids in token order)."""
        return [b.block_id for b in self._req_blocks.get(request_id, [])]

    def num_blocks_held(self, request_id: str) -> int:
        """Length of the request's block table."""
        return len(self._req_blocks.get(request_id, ()))

    def num_cached_blocks(self, request_id: str) -> int:
        """Leading blocks of the request whose hashes are recorded in the pool."""
        return self._num_cached_blocks.get(request_id, 0)

    def is_cached(self, block_hash: BlockHash) -> bool:
        """Whether a block with this hash is in the prefix cache."""
        return block_hash in self.block_pool.cached_block_hash_to_block

    def block_hashes(self, request: EngineRequest) -> list[BlockHash]:
        """Hashes of the request's full blocks, extended as it grows."""
        hashes = self._req_block_hashes.setdefault(request.request_id, [])
        size = self.block_size
        if (len(hashes) + 1) * size > request.num_tokens:
            return hashes  # no new full block: skip copying the token list (hot on every decode)
        start, prompt, output = len(hashes) * size, request.prompt_token_ids, request.output_token_ids
        # only the unhashed tail: copying a long prompt on every filled output block adds up
        if start >= len(prompt):
            tail = output[start - len(prompt):]
        else:  # a fresh prompt is hashed as it is, without a copy
            tail = prompt[start:] + output if start or output else prompt
        parent = hashes[-1] if hashes else None
        hashes.extend(self._hash_chain(parent, tail, size, request.lora))
        return hashes

    def get_computed_blocks(self, request: EngineRequest) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of full blocks, and its length in tokens.

        At least the last token is always left to compute, since its logits give the next token."""
        if not self.enable_caching:
            return [], 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for block_hash in self.block_hashes(request)[:max_hit_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_cache_stats(self, request: EngineRequest, num_hit_tokens: int) -> None:
        """Count an admitted request's lookup (vLLM's `record_prefix_cache_stats`): only at
        admission, so a lookup whose request stays queued is not counted, and not for a
        preempted request."""
        if self.enable_caching and not request.num_preemptions:
            self.prefix_cache_stats.queries += request.num_tokens
            self.prefix_cache_stats.hits += num_hit_tokens

    def allocate_slots(
        self,
        request: EngineRequest,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
        full_sequence_tokens: int = 0,
        num_computed_tokens: int | None = None,
    ) -> list[KVCacheBlock] | None:
        """Give the request room for num_new_tokens more tokens after its computed and cache-hit ones.

        With `full_sequence_tokens`, first require room for that many tokens in all (vLLM's
        admission gate `full_sequence_must_fit`). `num_computed_tokens` overrides the request's
        (async scheduling counts the tokens of steps in flight). Returns the newly taken blocks,
        or None (nothing changed) when too few blocks are free."""
        computed = list(new_computed_blocks or [])
        req_blocks = self._req_blocks.setdefault(request.request_id, [])
        if full_sequence_tokens:
            num_full = -(-full_sequence_tokens // self.block_size) - len(req_blocks) - len(computed)
            num_evictable_hits = sum(1 for b in computed if b.ref_cnt == 0)
            if max(0, num_full) + num_evictable_hits > self.block_pool.get_num_free_blocks():
                return None
        if num_computed_tokens is None:
            num_computed_tokens = request.num_computed_tokens
        num_computed = num_computed_tokens + len(computed) * self.block_size
        num_required = -(-(num_computed + num_new_tokens) // self.block_size)
        num_new_blocks = max(0, num_required - len(req_blocks) - len(computed))
        if computed:
            num_evictable_hits = sum(1 for b in computed if b.ref_cnt == 0)
            if num_new_blocks + num_evictable_hits > self.block_pool.get_num_free_blocks():
                return None
            self.block_pool.touch(computed)
            req_blocks.extend(computed)
        elif num_new_blocks > self.block_pool.get_num_free_blocks():
            return None
        # most decode steps need no new block: skip the pool call and the empty list it builds
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks) if num_new_blocks else []
        req_blocks.extend(new_blocks)
        self.cache_full_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))
        return new_blocks

    def take_blocks_for(self, request: EngineRequest, num_tokens: int) -> None:
        """Extend the request's block table to hold its first `num_tokens` tokens and cache the
        full blocks: `allocate_slots` for a decode step without its checks, for a caller that
        made sure enough blocks are free and that the step brings no cache hits."""
        blocks = self._req_blocks[request.request_id]
        missing = -(-num_tokens // self.block_size) - len(blocks)
        if missing > 0:
            blocks.extend(self.block_pool.get_new_blocks(missing))
        self.cache_full_blocks(request, num_tokens)

    def append_new_blocks(self, requests: list[EngineRequest], order: list[int]) -> None:
        """Take `len(order)` blocks in one pool call and append the i-th to the table of
        `requests[order[i]]`: the order in which steps one by one would have taken them."""
        if not order:
            return
        tables = [self._req_blocks[r.request_id] for r in requests]
        for pos, block in zip(order, self.block_pool.get_new_blocks(len(order)), strict=True):
            tables[pos].append(block)

    def cache_full_blocks(self, request: EngineRequest, num_tokens: int) -> None:
        """Record the hashes of the request's blocks filled by its first `num_tokens` tokens."""
        if not self.enable_caching:
            return
        rid = request.request_id
        num_cached = self._num_cached_blocks.get(rid, 0)
        if num_tokens // self.block_size <= num_cached:
            return
        hashes = self.block_hashes(request)
        blocks = self._req_blocks[rid]
        num_full = min(num_tokens // self.block_size, len(hashes))
        if self.block_pool.kv_event_queue is not None:
            self._queue_block_stored(request, blocks, hashes, num_cached, num_full)
        self.block_pool.cache_full_blocks(blocks[num_cached:num_full], hashes[num_cached:num_full])
        self._num_cached_blocks[rid] = max(num_full, num_cached)

    def _queue_block_stored(self, request: EngineRequest, blocks: list[KVCacheBlock], hashes: list[BlockHash],
                            num_cached: int, num_full: int) -> None:
        """vLLM's `BlockPool.cache_full_blocks` event: one `BlockStored` for the blocks this call
        hashes, chained to the block before them. Leading blocks that already hold their hash are
        the request's prefix-cache hits, which vLLM counts as cached before the call."""
        first = num_cached
        while first < num_full and blocks[first].block_hash is not None:
            first += 1
        if first >= num_full:
            return
        size, lora = self.block_size, request.lora
        assert self.block_pool.kv_event_queue is not None
        self.block_pool.kv_event_queue.append(BlockStored(
            block_hashes=[external_block_hash(h) for h in hashes[first:num_full]],
            parent_block_hash=external_block_hash(hashes[first - 1]) if first else None,
            token_ids=request.all_token_ids[first * size:num_full * size],
            block_size=size,
            lora_id=None if lora is None else self.lora_id(lora),
            medium=MEDIUM_GPU,
            lora_name=lora,
            extra_keys=[None if lora is None else (lora,)] * (num_full - first),
            group_idx=0,
            kv_cache_spec_kind=KV_CACHE_SPEC_KIND))

    def lora_id(self, lora: str) -> int:
        """vLLM's int id of an adapter: the next free one at its registration or first use."""
        return self.lora_ids.setdefault(lora, len(self.lora_ids) + 1)

    def take_events(self) -> list[KVEvent]:
        """The KV events queued since the last call, oldest first ([] when events are off)."""
        return self.block_pool.take_events()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, only when no request holds blocks (False otherwise)."""
        return self.block_pool.reset_prefix_cache()

    def cached_block_hashes(self) -> list[BlockHash]:
        """The engine's hash of every block holding one (a duplicate copy once per block)."""
        return self.block_pool.cached_block_hashes()

    def free(self, request: EngineRequest) -> None:
        """Release the request's blocks, last block first, so a sequence's tail is evicted before its head."""
        rid = request.request_id
        blocks = self._req_blocks.pop(rid, [])
        self._num_cached_blocks.pop(rid, None)
        self.block_pool.free_blocks(reversed(blocks))
        if request.status.is_finished:
            self._req_block_hashes.pop(rid, None)
