"""llama-server slots: a deferred FIFO, slot choice by prompt similarity or LRU, per-slot prompt reuse.

There is no preemption. With a unified KV pool a request leaves the deferred queue only when an
idle slot exists and its uncached prompt fits the free cells (idle slots' caches are dropped,
least recently used first, to make room); a generating request that finds no free cell stops with
finish_reason "length", as llama-server stops a slot that runs out of context.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from fake_engines.core import _llamacpp_decode_run as _decode_run
from fake_engines.core._config import LlamaCppSchedulerConfig
from fake_engines.core._generator import TokenSource, next_token_ids, request_tokens
from fake_engines.core._progress import advance_request
from fake_engines.core._request import (
    EngineRequest,
    RequestOutput,
    RequestRejected,
    RequestStatus,
    ScheduledStep,
    SchedulerStats,
)
from fake_engines.core._slot import Slot, common_prefix_len, select_slot
from fake_engines.core._step_builder import StepBuilder, decode_run_batch, is_decode
from fake_engines.perf.batch import StepBatch
from flotilla.kv_events import KVEvent

_UNSET = object()  # no slot batched yet in this iteration (a LoRA key may itself be None)


class LlamaCppScheduler:
    """The EngineCore of the llama-server look-alike."""

    holds_step_at_schedule = False
    """A slot's cells grow when its iteration finishes, not when it is scheduled."""
    async_scheduling = False
    """llama-server applies each iteration before it starts the next."""

    def __init__(self, config: LlamaCppSchedulerConfig) -> None:
        self.config = config
        self.max_concurrent_batches = 1
        self.slots = [Slot(id=i, n_ctx=config.slot_n_ctx) for i in range(config.num_slots)]
        self.deferred: deque[EngineRequest] = deque()
        self.requests: dict[str, EngineRequest] = {}
        self._slot_of: dict[str, Slot] = {}
        self._streams: dict[str, TokenSource] = {}
        self._in_flight: ScheduledStep | None = None
        self._out_of_cells: set[str] = set()
        self._clock = 0
        self._next_task = 0
        self._host_cache: list[tuple[list[int], str | None]] = []
        """Prompts saved to host memory (--cache-ram), least recently used first."""
        self.log: Callable[[str], None] | None = None
        """Where llama-server's debug lines go (--verbose); None: nowhere. The core does no I/O itself."""
        self._totals = {"queries": 0, "prompt": 0, "cached": 0, "generation": 0, "steps": 0, "aborted": 0,
                        "busy_slots": 0, "tokens_max": 0}

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; RequestRejected when the prompt does not fit a slot's context."""
        n_ctx = self.config.slot_n_ctx
        if request.num_prompt_tokens >= n_ctx:
            raise RequestRejected(
                f"request ({request.num_prompt_tokens} tokens) exceeds the available context size "
                f"({n_ctx} tokens), try increasing it", request.num_prompt_tokens, n_ctx)
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self._streams[request.request_id] = request_tokens(self.config.seed, request.request_id, request.sampling)
        self.deferred.append(request)
        self._launch_deferred()

    def abort_request(self, request_id: str) -> bool:
        """Drop a request and free its slot now; False when unknown or already finished."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        request.status = RequestStatus.FINISHED_ABORTED
        self._totals["aborted"] += 1
        if request_id in self._slot_of:
            self._release(request)
        else:
            self.deferred.remove(request)
            self._forget(request)
        self._launch_deferred()
        return True

    def _forget(self, request: EngineRequest) -> None:
        del self.requests[request.request_id]
        del self._streams[request.request_id]

    def _free_cells(self) -> int:
        """KV cells of the pool not held by busy slots or idle caches (unified pool only)."""
        return self.config.n_ctx - sum(s.used_cells for s in self.slots)

    def _make_room(self, cells: int, keep: Slot | None = None) -> bool:
        """Drop idle slots' caches, least recently used first, until `cells` are free."""
        if not self.config.unified:
            return True
        idle = sorted((s for s in self.slots if not s.is_processing and s is not keep),
                      key=lambda s: (s.t_last_used, -s.id))
        for slot in idle:
            if self._free_cells() >= cells:
                break
            slot.cache_tokens = []
        return self._free_cells() >= cells

    def _launch_deferred(self) -> None:
        """Move deferred requests into idle slots, in FIFO order, while they fit; one that asks for a
        busy slot (`id_slot`) stays deferred without holding up those behind it."""
        i = 0
        while i < len(self.deferred):
            request = self.deferred[i]
            pinned = self.slot_by_id(request.id_slot) if request.id_slot != -1 else None
            if pinned is not None and pinned.is_processing:
                i += 1
                continue
            slot = pinned or select_slot(self.slots, request.prompt_token_ids, self.config.slot_prompt_similarity)
            if slot is None or not self._make_room(self._cells_to_launch(slot, request), keep=slot):
                return
            del self.deferred[i]
            self._launch(slot, request)

    def _reusable_prefix(self, slot: Slot, request: EngineRequest) -> int:
        """Prompt tokens the slot can reuse: the common prefix, none after a LoRA change, never all."""
        if slot.cache_lora != request.lora:
            return 0
        lcp = common_prefix_len(slot.cache_tokens, request.prompt_token_ids)
        return min(lcp, request.num_prompt_tokens - 1)

    def _cells_to_launch(self, slot: Slot, request: EngineRequest) -> int:
        """Free cells a launch needs: the prompt is reserved whole, the slot's old cache is given up."""
        return request.num_prompt_tokens - len(slot.cache_tokens)

    def _launch(self, slot: Slot, request: EngineRequest) -> None:
        if self.config.cache_ram_tokens and not request.is_prompt_only:
            self._swap_with_host_cache(slot, request)
        # embedding and rerank tasks are stateless in llama-server: they reuse no cached prefix
        n_cache = 0 if request.is_prompt_only else self._reusable_prefix(slot, request)
        slot.cache_tokens = []
        slot.request = request
        request.slot_id = slot.id
        slot.id_task = self._next_task
        self._next_task += 1
        slot.last_request_id = request.request_id
        slot.last_n_prompt_tokens = request.num_prompt_tokens
        slot.n_prompt_tokens_cache = n_cache
        request.num_computed_tokens = n_cache
        request.num_cached_tokens = n_cache
        request.status = RequestStatus.RUNNING
        self._slot_of[request.request_id] = slot
        self._totals["cached"] += n_cache
        self._totals["queries"] += request.num_prompt_tokens
        if self.config.cache_idle_slots and self.config.cache_ram_tokens:
            self._cache_idle_slots()

    def _cache_idle_slots(self) -> None:
        """--cache-idle-slots, after a launch: each idle slot's prompt is saved to the host cache
        (unless already held there); with a unified pool the slot is then cleared, its cells freed."""
        for slot in self.slots:
            if slot.is_processing:
                continue
            if slot.cache_tokens and self._save_to_host(slot.cache_tokens, slot.cache_lora):
                self._log("__TEST_TAG_CACHE_IDLE_SLOT__")  # llama-server's debug line, word for word
            if self.config.unified:
                slot.cache_tokens, slot.cache_lora = [], None

    def _save_to_host(self, tokens: list[int], lora: str | None) -> bool:
        """server_prompt_cache::alloc: False when a saved prompt already holds these tokens or they
        exceed the whole cache; saved prompts they contain are dropped, the oldest go to make room."""
        limit = self.config.cache_ram_tokens
        if any(common_prefix_len(saved, tokens) == len(tokens) for saved, _ in self._host_cache) \
                or 0 < limit < len(tokens):
            return False
        self._host_cache = [(t, lo) for t, lo in self._host_cache if common_prefix_len(t, tokens) < len(t)]
        self._host_cache.append((list(tokens), lora))
        self._trim_host_cache()
        return True

    def _log(self, message: str) -> None:
        if self.log is not None:
            self.log(message)

    def _swap_with_host_cache(self, slot: Slot, request: EngineRequest) -> None:
        """llama-server's server_prompt_cache: before a prompt that keeps less than half of the
        slot's cached tokens replaces them, they are saved to host memory; then the saved prompt
        sharing the longest prefix with the new one, if longer than what the slot shares, is
        loaded into the slot (and leaves the host cache)."""
        keep = self._reusable_prefix(slot, request)
        if not slot.cache_tokens or keep < len(slot.cache_tokens) / 2:
            self._log("updating prompt cache")
        if slot.cache_tokens and keep < len(slot.cache_tokens) / 2:
            self._save_to_host(slot.cache_tokens, slot.cache_lora)
        best, best_len = None, keep
        for i, (tokens, lora) in enumerate(self._host_cache):
            shared = min(common_prefix_len(tokens, request.prompt_token_ids), request.num_prompt_tokens - 1)
            if lora == request.lora and shared > best_len:
                best, best_len = i, shared
        if best is not None:
            slot.cache_tokens, slot.cache_lora = self._host_cache.pop(best)
        self._trim_host_cache()

    def _trim_host_cache(self) -> None:
        """Drop the least recently saved prompts until the cache fits --cache-ram."""
        limit = self.config.cache_ram_tokens
        while limit > 0 and sum(len(t) for t, _ in self._host_cache) > limit:
            self._host_cache.pop(0)

    def _release(self, request: EngineRequest) -> None:
        """Free the request's slot; the slot keeps the computed tokens for the next similar prompt."""
        slot = self._slot_of.pop(request.request_id)
        slot.cache_tokens = request.all_token_ids[:request.num_computed_tokens]
        slot.cache_lora = request.lora
        slot.request = None
        self._clock += 1
        slot.t_last_used = self._clock
        self._forget(request)

    def schedule(self) -> ScheduledStep | None:
        """One iteration: a token per generating slot, then prompt chunks, one LoRA configuration only."""
        if self._in_flight is not None:
            return None
        builder = StepBuilder(token_budget=self.config.n_batch)
        batched_lora = self._schedule_generating(builder)
        self._schedule_prompts(builder, batched_lora)
        if not builder.num_scheduled_tokens:
            return None
        assert len(builder.lora_adapters) <= 1 and builder.token_budget >= 0
        self._in_flight = builder.build(self._totals["steps"])
        return self._in_flight

    def _busy(self) -> list[EngineRequest]:
        return [s.request for s in self.slots if s.request is not None]

    @property
    def running(self) -> list[EngineRequest]:
        """Requests in slots, in slot order."""
        return self._busy()

    @property
    def waiting(self) -> deque[EngineRequest]:
        """Deferred requests, oldest first."""
        return self.deferred

    cache_capacity_tokens = None
    """No block cache to report (the proxy reads that figure from vLLM only)."""

    @property
    def kv_cache_usage(self) -> float:
        """Share of the pool's cells busy slots hold (stats().kv_cache_usage without the rest)."""
        return min(1.0, sum(s.used_cells for s in self.slots if s.is_processing) / self.config.n_ctx)

    def decode_run_length(self) -> int:
        """Iterations from the next `schedule()` that decode the same requests, none finishing
        before the last, if nothing is added or aborted (0 when the next is not such an iteration)."""
        if self._in_flight is not None:
            return 0
        return _decode_run.decode_run_length(self, self._free_cells())

    def decode_run_batch(self) -> tuple[StepBatch, int]:
        """The next decode run's first batch and the context tokens each later iteration adds."""
        return decode_run_batch(self.running)

    def kv_cache_usage_after(self, num_steps: int) -> float:
        """KV usage once the next `num_steps` decode-run iterations are scheduled, without applying them."""
        return _decode_run.kv_cache_usage_after(self, num_steps)

    def apply_decode_steps(self, num_steps: int) -> None:
        """Apply the next `num_steps` iterations at once, exactly as schedule() and finish_step()
        would; only for fewer than `decode_run_length()`, so none finishes a request."""
        if num_steps <= 0:
            return
        busy = self.running
        totals = self._totals
        for request in busy:
            request.output_token_ids.extend(next_token_ids(self._streams[request.request_id], num_steps))
            request.num_computed_tokens += num_steps
            totals["tokens_max"] = max(totals["tokens_max"], request.num_tokens)
        totals["steps"] += num_steps
        totals["busy_slots"] += num_steps * len(busy)
        totals["generation"] += num_steps * len(busy)

    def _schedule_generating(self, builder: StepBuilder) -> object:
        """Add one token per generating slot that can batch with the first one; return the batch's LoRA."""
        batched_lora: object = _UNSET
        num_decodes = 0
        for request in self._busy():
            if not request.output_token_ids or builder.token_budget <= 0:
                continue
            if batched_lora is not _UNSET and request.lora != batched_lora:
                continue
            batched_lora = request.lora
            num_decodes += 1
            if not self._make_room(num_decodes):
                self._out_of_cells.add(request.request_id)
            builder.add(request, 1)
        return batched_lora

    def _schedule_prompts(self, builder: StepBuilder, batched_lora: object) -> None:
        """Add pending prompt tokens of processing slots, slot order, up to n_batch in all."""
        for request in self._busy():
            if request.output_token_ids or builder.token_budget <= 0:
                continue
            if batched_lora is not _UNSET and request.lora != batched_lora:
                continue
            batched_lora = request.lora
            remaining = request.num_prompt_tokens - request.num_computed_tokens
            builder.add(request, min(remaining, builder.token_budget))

    def finish_step(self, step: ScheduledStep) -> list[RequestOutput]:
        """Advance the step's requests, emit tokens, free finished requests' slots."""
        assert step is self._in_flight, "finish_step takes the step schedule() returned last"
        self._in_flight = None
        self._totals["steps"] += 1
        self._totals["busy_slots"] += len(self._busy())
        outputs = []
        for request_id, num_new in step.num_scheduled_tokens.items():
            request = self.requests.get(request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted while its step was in flight
            output = self._advance(request, num_new)
            if output is not None:
                outputs.append(output)
        self._out_of_cells.clear()
        self._launch_deferred()
        return outputs

    def _advance(self, request: EngineRequest, num_new: int) -> RequestOutput | None:
        if not is_decode(request, num_new):
            self._totals["prompt"] += num_new
        limit = self.config.slot_n_ctx
        if request.request_id in self._out_of_cells:
            limit = request.num_tokens + 1  # the pool is full: this token is the last
        output = advance_request(request, num_new, self._streams[request.request_id], limit)
        if output is None:
            return None
        self._totals["generation"] += len(output.new_token_ids)
        self._totals["tokens_max"] = max(self._totals["tokens_max"], request.num_tokens)
        if output.finished:
            self._release(request)
        return output

    def stats(self) -> SchedulerStats:
        """Gauges and counters as of now; `slots` feeds `/slots`."""
        busy = self._busy()
        return SchedulerStats(
            num_running=len(busy),
            num_waiting=len(self.deferred),
            kv_cache_usage=self.kv_cache_usage,
            prefix_cache_queries=self._totals["queries"],
            prefix_cache_hits=self._totals["cached"],
            prompt_tokens_total=self._totals["prompt"],
            prompt_tokens_cached_total=self._totals["cached"],
            prompt_tokens_computed_total=self._totals["prompt"],
            generation_tokens_total=self._totals["generation"],
            num_steps=self._totals["steps"],
            num_aborted=self._totals["aborted"],
            running_lora_adapters=tuple(sorted({r.lora for r in busy if r.lora})),
            waiting_lora_adapters=tuple(sorted({r.lora for r in self.deferred if r.lora})),
            slots=tuple(s.state() for s in self.slots),
            n_busy_slots_total=self._totals["busy_slots"],
            n_tokens_max=self._totals["tokens_max"],
        )

    def has_unfinished_requests(self) -> bool:
        """True while any request is deferred or in a slot."""
        return bool(self.requests)

    def slot_by_id(self, id_slot: int) -> Slot | None:
        """llama-server's get_slot_by_id: an id past the last slot wraps around; a negative one is none."""
        index = int(math.fmod(id_slot, len(self.slots)))  # C++'s %: -1 % 2 is -1
        return self.slots[index] if index >= 0 else None

    def erase_slot(self, slot: Slot) -> int:
        """Drop an idle slot's cached tokens (POST /slots/ID?action=erase); how many there were."""
        assert not slot.is_processing
        n_erased, slot.cache_tokens, slot.cache_lora = len(slot.cache_tokens), [], None
        return n_erased

    def load_slot(self, slot: Slot, tokens: list[int]) -> bool:
        """Make `tokens` an idle slot's cache, as if it had just computed them (a restored slot
        file); False when the KV pool has no room for them even after dropping other idle caches."""
        assert not slot.is_processing
        slot.cache_tokens, slot.cache_lora = [], None
        if not self._make_room(len(tokens), keep=slot):
            return False
        slot.cache_tokens = list(tokens)
        return True

    def take_kv_events(self) -> list[KVEvent]:
        """Always []: llama.cpp publishes no KV cache events."""
        return []
