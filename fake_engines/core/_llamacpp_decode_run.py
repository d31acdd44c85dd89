"""Decode runs of the llama.cpp core: identical generation-only iterations applied at once.

While every busy slot is generating (no prompt being processed), all share one LoRA
configuration, none finishes before the last iteration, and the unified pool has a free cell
for every new token without dropping an idle slot's cache, iterations differ only in context
lengths. Nothing else moves between them: no slot frees, and cells only fill, so a deferred
request that could not start before the run cannot start during it; the launch attempt after
each iteration finds the same slot and has already dropped the idle caches it would drop.
Every request draws its tokens from its own stream, so applying k iterations at once leaves
tokens, slots and counters exactly as k calls of schedule() and finish_step() would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fake_engines.core._request import EngineRequest

if TYPE_CHECKING:
    from fake_engines.core._llamacpp_scheduler import LlamaCppScheduler


def _generating(sched: LlamaCppScheduler) -> list[EngineRequest] | None:
    """The busy slots' requests when each of them decodes in the next iteration, else None."""
    busy = sched.running
    if not busy or len(busy) > sched.config.n_batch:
        return None
    if any(not r.output_token_ids for r in busy) or len({r.lora for r in busy}) > 1:
        return None
    return busy


def decode_run_length(sched: LlamaCppScheduler, free_cells: int) -> int:
    """Iterations from the next `schedule()` that decode the same requests, none finishing before
    the last, if nothing is added or aborted; 0 if none. The scheduler has checked that no
    iteration is in flight; `free_cells` are the unified pool's cells no slot holds."""
    busy = _generating(sched)
    if busy is None:
        return 0
    limit = sched.config.slot_n_ctx
    # iteration s appends token s: a request stops at its target length or at the slot's context
    steps = min(min(r.target_output_len - len(r.output_token_ids), limit - r.num_tokens) for r in busy)
    if sched.config.unified:  # each iteration needs a free cell per request, with idle caches kept
        steps = min(steps, free_cells // len(busy))
    return max(steps, 0)


def kv_cache_usage_after(sched: LlamaCppScheduler, num_steps: int) -> float:
    """KV usage once `num_steps` more decode-run iterations are scheduled: a slot's cells grow
    when its iteration finishes, so all but the last of them count."""
    busy = sched.running
    held = sum(s.used_cells for s in sched.slots if s.is_processing) + max(0, num_steps - 1) * len(busy)
    return min(1.0, held / sched.config.n_ctx)
