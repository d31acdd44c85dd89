"""Decode runs: many identical decode-only steps applied at once, exactly as step by step.

Between arrivals a vLLM engine often runs the same requests for hundreds of steps, each
computing one token per request. While no request waits, none finishes, and the KV cache has
the blocks the run needs, the steps differ only in their context lengths, so a simulator may
apply a whole stretch at once. The pool sees the same calls in the same order as step by step
(block allocations and full-block caching, by step then by request), and every request draws
its tokens from its own stream in the same order, so block ids, cache contents, token ids and
counters end up identical.
"""

from __future__ import annotations

from fake_engines.core._kv_cache_manager import KVCacheManager
from fake_engines.core._request import EngineRequest


def _is_decoding(request: EngineRequest) -> bool:
    return bool(request.output_token_ids) and request.num_computed_tokens == request.num_tokens - 1


def _blocks_needed(running: list[EngineRequest], block_size: int, held: list[int], num_steps: int) -> int:
    """New blocks the running requests take over `num_steps` decode steps."""
    total = 0
    for request, have in zip(running, held, strict=True):
        # step s computes token number num_tokens + s, so it needs ceil((num_tokens + s) / size) blocks
        total += max(0, -(-(request.num_tokens + num_steps - 1) // block_size) - have)
    return total


def decode_run_length(running: list[EngineRequest], max_num_batched_tokens: int, kv: KVCacheManager) -> int:
    """Steps, from the next `schedule()`, that are all decode-only steps of the same requests
    with no finish before the last and no preemption, if nothing is added or aborted; 0 if none.
    The scheduler has checked that no step is in flight and no request waits."""
    if not running or len(running) > max_num_batched_tokens:
        return 0
    steps = min(r.target_output_len - len(r.output_token_ids) for r in running)
    if steps < 1 or not all(_is_decoding(r) for r in running):
        return 0
    held = [kv.num_blocks_held(r.request_id) for r in running]
    free = kv.get_num_free_blocks()
    if _blocks_needed(running, kv.block_size, held, steps) <= free:
        return steps
    low, high = 0, steps  # low always fits, high never does
    while high - low > 1:
        mid = (low + high) // 2
        if _blocks_needed(running, kv.block_size, held, mid) <= free:
            low = mid
        else:
            high = mid
    return low


def kv_cache_usage_after(running: list[EngineRequest], kv: KVCacheManager, num_steps: int) -> float:
    """KV usage once `num_steps` more decode-run steps are scheduled (the same float as
    `stats().kv_cache_usage` would then read)."""
    held = [kv.num_blocks_held(r.request_id) for r in running]
    return kv.usage_after(_blocks_needed(running, kv.block_size, held, num_steps))


def _pool_events(starts: list[int], block_size: int, num_steps: int) -> list[tuple[int, int]]:
    """(step, request position) where the pool may change: a token opens or fills a block."""
    events: list[tuple[int, int]] = []
    for pos, first in enumerate(starts):  # tokens each request holds when step 0 is scheduled
        # token counts n in [first, first + num_steps) with n % block_size in {0, 1}
        for residue in {0, 1 % block_size}:
            offset = (residue - first) % block_size
            events.extend((step, pos) for step in range(offset, num_steps, block_size))
    events.sort()
    return events


def _opens(starts: list[int], held: list[int], block_size: int, num_steps: int) -> list[int] | None:
    """Request positions in the order step by step takes their new blocks (by step, then
    position), one entry per block; None unless every request holds the blocks of all but its
    newest token, as after any decode step. Then a request takes one block exactly when its
    token count n at scheduling is 1 past a block boundary beyond those it holds."""
    width = len(starts)
    keys: list[int] = []
    for pos, (first, have) in enumerate(zip(starts, held, strict=True)):
        if have * block_size < first - 1:
            return None
        step = have * block_size + 1 - first
        keys.extend(range(step * width + pos, num_steps * width, block_size * width))
    keys.sort()
    return [key % width for key in keys]


def _last_cached_tokens(first: int, num_steps: int, block_size: int) -> int:
    """Most tokens any of the run's cache_full_blocks calls covers for a request starting at
    `first` tokens (calls come at counts n with n % block_size in {0, 1}); -1 if none."""
    last = first + num_steps - 1
    best = -1
    for residue in {0, 1 % block_size}:
        count = last - (last - residue) % block_size
        if count >= first:
            best = max(best, count)
    return best


def _new_hashes(kv: KVCacheManager, running: list[EngineRequest], num_steps: int,
                starts: list[int]) -> list[tuple[int, int]] | None:
    """Per request, the (from, to) block range the run caches; None when a new hash is already
    cached or repeats, where interleaving with evictions matters and steps go one by one."""
    size = kv.block_size
    ranges, seen = [], set()
    for request, start in zip(running, starts, strict=True):
        hashes = kv.block_hashes(request)
        last = _last_cached_tokens(start, num_steps, size)
        num_cached = kv.num_cached_blocks(request.request_id)
        num_full = min(last // size, len(hashes)) if last >= 0 else num_cached
        for block_hash in hashes[num_cached:num_full]:
            if block_hash in seen or kv.is_cached(block_hash):
                return None
            seen.add(block_hash)
        ranges.append((num_cached, num_full))
    return ranges


def apply_decode_steps(kv: KVCacheManager, running: list[EngineRequest], starts: list[int], num_steps: int) -> None:
    """The KV side of `num_steps` decode steps applied at once, after each request's new tokens
    were drawn (`starts`: its token count before them): block tables, cached blocks and computed
    tokens end as step by step. Fewer steps than `decode_run_length()`, so none finishes."""
    ranges = _new_hashes(kv, running, num_steps, starts) if kv.enable_caching else [(0, 0)] * len(running)
    if ranges is None or not _apply_in_bulk(kv, running, starts, num_steps, ranges):
        _apply_step_by_step(kv, running, num_steps, starts)
    for request, start in zip(running, starts, strict=True):
        request.num_computed_tokens = start + num_steps - 1


def _apply_in_bulk(kv: KVCacheManager, running: list[EngineRequest], starts: list[int], num_steps: int,
                   ranges: list[tuple[int, int]]) -> bool:
    """The run's blocks taken in one pool call, in the order step by step would take them, then
    each request's filled blocks cached in one call: with no new hash already cached or repeated,
    the evictions and insertions touch disjoint keys, so their interleaving does not matter.
    False (nothing changed) when the block tables are not as after a decode step."""
    held = [kv.num_blocks_held(r.request_id) for r in running]
    order = _opens(starts, held, kv.block_size, num_steps)
    if order is None:
        return False
    kv.append_new_blocks(running, order)
    for request, (low, high) in zip(running, ranges, strict=True):
        if high > low:
            kv.cache_full_blocks(request, high * kv.block_size)
    return True


def _apply_step_by_step(kv: KVCacheManager, running: list[EngineRequest], num_steps: int, starts: list[int]) -> None:
    for step, pos in _pool_events(starts, kv.block_size, num_steps):
        # allocate_slots(request, 1) at that step, less its checks: decode_run_length made
        # sure the blocks are free, and a decode step brings no cache hits
        kv.take_blocks_for(running[pos], starts[pos] + step)  # tokens held when step `step` is scheduled
