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

from typing import TYPE_CHECKING

from fake_engines.core._generator import next_token_ids
from fake_engines.core._request import EngineRequest
from fake_engines.perf.batch import StepBatch

if TYPE_CHECKING:
    from fake_engines.core._vllm_scheduler import VllmScheduler


def _is_decoding(request: EngineRequest) -> bool:
    return bool(request.output_token_ids) and request.num_computed_tokens == request.num_tokens - 1


def _blocks_needed(running: list[EngineRequest], block_size: int, held: list[int], num_steps: int) -> int:
    """New blocks the running requests take over `num_steps` decode steps."""
    total = 0
    for request, have in zip(running, held, strict=True):
        # step s computes token number num_tokens + s, so it needs ceil((num_tokens + s) / size) blocks
        total += max(0, -(-(request.num_tokens + num_steps - 1) // block_size) - have)
    return total


def decode_run_length(sched: VllmScheduler) -> int:
    """Steps, from the next `schedule()`, that are all decode-only steps of the same requests
    with no finish before the last and no preemption, if nothing is added or aborted; 0 if none."""
    running = sched.running
    if sched._in_flight or sched.waiting or not running:
        return 0
    if len(running) > sched.config.max_num_batched_tokens:
        return 0
    steps = min(r.target_output_len - len(r.output_token_ids) for r in running)
    if steps < 1 or not all(_is_decoding(r) for r in running):
        return 0
    kv = sched.kv_cache_manager
    held = [len(kv._req_blocks.get(r.request_id, ())) for r in running]
    free = kv.block_pool.get_num_free_blocks()
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


def kv_cache_usage_after(sched: VllmScheduler, num_steps: int) -> float:
    """KV usage once `num_steps` more decode-run steps are scheduled (the same float as
    `stats().kv_cache_usage` would then read)."""
    kv = sched.kv_cache_manager
    pool = kv.block_pool
    held = [len(kv._req_blocks.get(r.request_id, ())) for r in sched.running]
    free = pool.get_num_free_blocks() - _blocks_needed(sched.running, kv.block_size, held, num_steps)
    return 1.0 - free / pool.num_usable_blocks


def decode_run_batch(sched: VllmScheduler) -> tuple[StepBatch, int]:
    """The first step's batch of a decode run, and the context tokens each later step adds."""
    running = sched.running
    loras = {r.lora for r in running if r.lora is not None}
    batch = StepBatch(decode_seqs=len(running), decode_context_tokens=sum(r.num_tokens for r in running),
                      lora_adapters=len(loras))
    return batch, len(running)


def _pool_events(running: list[EngineRequest], block_size: int, num_steps: int) -> list[tuple[int, int]]:
    """(step, request position) where the pool may change: a token opens or fills a block."""
    events = []
    for pos, request in enumerate(running):
        first = request.num_tokens  # tokens the request holds when step 0 is scheduled
        # token counts n in [first, first + num_steps) with n % block_size in {0, 1}
        for residue in {0, 1 % block_size}:
            offset = (residue - first) % block_size
            events.extend((step, pos) for step in range(offset, num_steps, block_size))
    events.sort()
    return events


def apply_decode_steps(sched: VllmScheduler, num_steps: int) -> None:
    """Apply `num_steps` decode steps at once; `num_steps` must be below `decode_run_length()`
    so that no request finishes (the run's last step goes through schedule/finish_step)."""
    if num_steps <= 0:
        return
    running = sched.running
    kv = sched.kv_cache_manager
    starts = [r.num_tokens for r in running]
    events = _pool_events(running, kv.block_size, num_steps)
    for request in running:
        request.output_token_ids.extend(next_token_ids(sched._streams[request.request_id], num_steps))
        if kv.enable_caching:
            kv._block_hashes(request)  # the run's filled blocks hashed in one chain, not one call each
    size, pool = kv.block_size, kv.block_pool
    for step, pos in events:
        request = running[pos]
        num_tokens = starts[pos] + step  # held when step `step` is scheduled
        # allocate_slots(request, 1) at that step, less its checks: decode_run_length made
        # sure the blocks are free, and a decode step brings no cache hits
        blocks = kv._req_blocks[request.request_id]
        missing = -(-num_tokens // size) - len(blocks)
        if missing > 0:
            blocks.extend(pool.get_new_blocks(missing))
        kv.cache_full_blocks(request, num_tokens)
    for request, start in zip(running, starts, strict=True):
        request.num_computed_tokens = start + num_steps - 1
    sched._next_step_id += num_steps
    sched._totals["steps"] += num_steps
    sched._totals["generation"] += num_steps * len(running)
