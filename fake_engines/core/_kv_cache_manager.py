"""The scheduler's view of the KV cache: per-request block tables on top of `BlockPool`."""

from __future__ import annotations

from dataclasses import dataclass

from fake_engines.core._block_pool import HASH_ALGOS, BlockHash, BlockPool, KVCacheBlock
from fake_engines.core._request import EngineRequest


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups so far, in tokens."""

    queries: int = 0
    """Tokens of the requests looked up (prompt, plus output for a preempted request)."""
    hits: int = 0
    """Of those, tokens found cached."""


class KVCacheManager:
    """Allocates, shares and frees the KV blocks of requests; the scheduler's only door to the pool."""

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_caching: bool,
                 hash_algo: str = "sha256") -> None:
        self.block_size = block_size
        self._hash_chain = HASH_ALGOS[hash_algo]
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching)
        self.prefix_cache_stats = PrefixCacheStats()
        self._req_blocks: dict[str, list[KVCacheBlock]] = {}
        self._num_cached_blocks: dict[str, int] = {}
        self._req_block_hashes: dict[str, list[BlockHash]] = {}

    @property
    def usage(self) -> float:
        """Fraction of usable blocks referenced by live requests, in [0, 1]."""
        return self.block_pool.get_usage()

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table (block ids in token order)."""
        return [b.block_id for b in self._req_blocks.get(request_id, [])]

    def _block_hashes(self, request: EngineRequest) -> list[BlockHash]:
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
        for block_hash in self._block_hashes(request)[:max_hit_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        num_hit_tokens = len(hits) * self.block_size
        self.prefix_cache_stats.queries += request.num_tokens
        self.prefix_cache_stats.hits += num_hit_tokens
        return hits, num_hit_tokens

    def allocate_slots(
        self,
        request: EngineRequest,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
    ) -> list[KVCacheBlock] | None:
        """Give the request room for num_new_tokens more tokens after its computed and cache-hit ones.

        Returns the newly taken blocks, or None (nothing changed) when too few blocks are free."""
        computed = list(new_computed_blocks or [])
        req_blocks = self._req_blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(computed) * self.block_size
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

    def cache_full_blocks(self, request: EngineRequest, num_tokens: int) -> None:
        """Record the hashes of the request's blocks filled by its first `num_tokens` tokens."""
        if not self.enable_caching:
            return
        rid = request.request_id
        num_cached = self._num_cached_blocks.get(rid, 0)
        if num_tokens // self.block_size <= num_cached:
            return
        hashes = self._block_hashes(request)
        blocks = self._req_blocks[rid]
        num_full = min(num_tokens // self.block_size, len(hashes))
        self.block_pool.cache_full_blocks(blocks[num_cached:num_full], hashes[num_cached:num_full])
        self._num_cached_blocks[rid] = max(num_full, num_cached)

    def free(self, request: EngineRequest) -> None:
        """Release the request's blocks, last block first, so a sequence's tail is evicted before its head."""
        rid = request.request_id
        blocks = self._req_blocks.pop(rid, [])
        self._num_cached_blocks.pop(rid, None)
        self.block_pool.free_blocks(reversed(blocks))
        if request.status.is_finished:
            self._req_block_hashes.pop(rid, None)
