"""vLLM V1 scheduling: a token budget per step, chunked prefill, FIFO admission, recompute preemption."""

from __future__ import annotations

import random
from collections import deque

from fake_engines.core import _decode_run
from fake_engines.core._config import VllmSchedulerConfig
from fake_engines.core._generator import next_token_ids, token_stream
from fake_engines.core._kv_cache_manager import KVCacheManager
from fake_engines.core._progress import advance_request
from fake_engines.core._request import (
    EngineRequest,
    RequestOutput,
    RequestRejected,
    RequestStatus,
    ScheduledStep,
    SchedulerStats,
)
from fake_engines.core._step_builder import StepBuilder, decode_run_batch, is_decode
from fake_engines.perf.batch import StepBatch
from flotilla.kv_events import KVEvent, external_block_hash


def check_context(request: EngineRequest, max_model_len: int) -> None:
    """Raise RequestRejected, in vLLM's words, when the request cannot fit max_model_len."""
    n_prompt, max_tokens = request.num_prompt_tokens, request.max_tokens
    if n_prompt > max_model_len:
        raise RequestRejected(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
            f"contains at least {max_model_len + 1} input tokens, which exceeds this limit even without "
            f"any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={max_model_len + 1})", n_prompt, max_model_len)
    if max_tokens > max_model_len:
        raise RequestRejected(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
            n_prompt, max_model_len)
    if n_prompt + max_tokens > max_model_len:
        raise RequestRejected(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
            f"context length is {max_model_len} tokens and your request has {n_prompt} input tokens "
            f"({max_tokens} > {max_model_len} - {n_prompt}). (parameter=max_tokens, value={max_tokens})",
            n_prompt, max_model_len)


class VllmScheduler:
    """The EngineCore of the vLLM look-alike."""

    holds_step_at_schedule = True
    """A step's KV blocks are taken when it is scheduled."""

    def __init__(self, config: VllmSchedulerConfig) -> None:
        self.config = config
        self.max_concurrent_batches = config.max_concurrent_batches
        self.max_model_len: int = config.max_model_len or 0
        self.kv_cache_manager = KVCacheManager(
            config.num_gpu_blocks, config.block_size, config.enable_prefix_caching,
            config.prefix_caching_hash_algo, config.enable_kv_cache_events)
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.requests: dict[str, EngineRequest] = {}
        self._streams: dict[str, random.Random] = {}
        self._in_flight: dict[int, ScheduledStep] = {}
        self._in_flight_ids: set[str] = set()
        self._next_step_id = 0
        self._totals = {"preemptions": 0, "prompt": 0, "computed": 0, "generation": 0, "steps": 0,
                        "aborted": 0}

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; RequestRejected when prompt + max_tokens exceeds max_model_len."""
        check_context(request, self.max_model_len)
        self._check_fits_kv(request)
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self._streams[request.request_id] = token_stream(self.config.seed, request.request_id)
        self.waiting.append(request)

    def _check_fits_kv(self, request: EngineRequest) -> None:
        """Reject a request the whole cache could never hold (the last sampled token needs no slot).

        Only reachable when max_model_len sits within one block of the cache size."""
        most_computed = request.num_prompt_tokens + request.max_tokens - 1
        usable_tokens = self.kv_cache_manager.num_usable_blocks * self.config.block_size
        if most_computed > usable_tokens:
            raise RequestRejected(
                f"The request needs {most_computed} tokens of KV cache but only {usable_tokens} "
                f"can be stored. Please reduce the length of the input prompt or max_tokens.",
                request.num_prompt_tokens, usable_tokens)

    def abort_request(self, request_id: str) -> bool:
        """Drop a request and free its blocks now; False when unknown or already finished."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED_ABORTED
        self.kv_cache_manager.free(request)
        del self._streams[request_id]
        self._totals["aborted"] += 1
        return True

    def schedule(self) -> ScheduledStep | None:
        """Running requests first, then waiting ones FIFO (only in steps with no preemption)."""
        if len(self._in_flight) >= self.max_concurrent_batches:
            return None
        builder = StepBuilder(token_budget=self.config.max_num_batched_tokens)
        self._schedule_running(builder)
        if not builder.preempted_request_ids:
            self._schedule_waiting(builder)
        self._check_invariants(builder)
        if not builder.num_scheduled_tokens:
            return None
        step = builder.build(self._next_step_id)
        self._next_step_id += 1
        self._in_flight[step.step_id] = step
        self._in_flight_ids.update(step.num_scheduled_tokens)
        return step

    def _num_new_tokens(self, request: EngineRequest, num_computed: int, budget: int) -> int:
        num_new = request.num_tokens - num_computed
        if self.config.long_prefill_token_threshold:
            num_new = min(num_new, self.config.long_prefill_token_threshold)
        return min(num_new, budget)

    def _schedule_running(self, builder: StepBuilder) -> None:
        """Give every running request its decode token or next prefill chunk, preempting on KV shortage."""
        index = 0
        while index < len(self.running) and builder.token_budget > 0:
            request = self.running[index]
            if request.request_id in self._in_flight_ids:
                index += 1
                continue
            num_new = self._num_new_tokens(request, request.num_computed_tokens, builder.token_budget)
            if not self._allocate_or_preempt(request, num_new, index, builder):
                return
            builder.add(request, num_new)
            index += 1

    def _allocate_or_preempt(self, request: EngineRequest, num_new: int, index: int,
                             builder: StepBuilder) -> bool:
        """Allocate for the request, preempting the newest others until it fits; False if it was the victim."""
        while self.kv_cache_manager.allocate_slots(request, num_new) is None:
            victim = self._newest_preemptible(index)
            self._preempt(victim, builder)
            if victim is request:
                return False
        return True

    def _newest_preemptible(self, index: int) -> EngineRequest:
        """The newest running request at or after index that is not in an unfinished step."""
        for candidate in reversed(self.running[index:]):
            if candidate.request_id not in self._in_flight_ids:
                return candidate
        raise AssertionError("the request being scheduled is always preemptible")

    def _preempt(self, request: EngineRequest, builder: StepBuilder) -> None:
        """Free the request's blocks (they stay cached) and put it at the queue head to recompute."""
        self.running.remove(request)
        request.status = RequestStatus.PREEMPTED
        self.kv_cache_manager.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self._totals["preemptions"] += 1
        self.waiting.appendleft(request)
        builder.preempted_request_ids.append(request.request_id)

    def _lora_blocked(self, request: EngineRequest, loras: set[str]) -> bool:
        """True when admitting the request would bring one adapter too many.

        Counted over all running requests, so no step ever holds more than max_loras adapters."""
        return (request.lora is not None and request.lora not in loras
                and len(loras) >= self.config.max_loras)

    def _schedule_waiting(self, builder: StepBuilder) -> None:
        """Admit queued requests in FIFO order while budget, sequence slots and KV blocks last."""
        loras = {r.lora for r in self.running if r.lora is not None}
        skipped: list[EngineRequest] = []
        while self.waiting and builder.token_budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if self._lora_blocked(request, loras):
                skipped.append(self.waiting.popleft())
                continue
            if not self._admit(request, builder):
                break
            if request.lora is not None:
                loras.add(request.lora)
        self.waiting.extendleft(reversed(skipped))

    def _admit(self, request: EngineRequest, builder: StepBuilder) -> bool:
        """Look up the prefix cache, allocate, and move the queue head to running; False if KV is full."""
        hits, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(request)
        num_new = self._num_new_tokens(request, num_hit_tokens, builder.token_budget)
        if self.kv_cache_manager.allocate_slots(request, num_new, hits) is None:
            return False
        self.waiting.popleft()
        if request.status is RequestStatus.PREEMPTED:
            builder.resumed_request_ids.append(request.request_id)
        else:
            builder.new_request_ids.append(request.request_id)
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_hit_tokens
        request.num_computed_tokens = num_hit_tokens
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        builder.add(request, num_new)
        return True

    def _check_invariants(self, builder: StepBuilder) -> None:
        assert len(self.running) <= self.config.max_num_seqs
        assert builder.token_budget >= 0
        assert len(builder.lora_adapters) <= self.config.max_loras or not builder.lora_adapters
        assert 0.0 <= self.kv_cache_manager.usage <= 1.0

    def finish_step(self, step: ScheduledStep) -> list[RequestOutput]:
        """Advance the step's requests, emit tokens, free finished requests."""
        del self._in_flight[step.step_id]
        self._totals["steps"] += 1
        outputs = []
        for request_id, num_new in step.num_scheduled_tokens.items():
            self._in_flight_ids.discard(request_id)
            request = self.requests.get(request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted while its step was in flight
            output = self._advance(request, num_new)
            if output is not None:
                outputs.append(output)
        return outputs

    def _advance(self, request: EngineRequest, num_new: int) -> RequestOutput | None:
        if not is_decode(request, num_new):
            self._totals["computed"] += num_new
        output = advance_request(request, num_new, self._streams[request.request_id])
        if output is None:
            return None
        self._totals["generation"] += 1
        if output.is_first_token:
            self._totals["prompt"] += request.num_prompt_tokens
        if output.finished:
            self.running.remove(request)
            self.kv_cache_manager.free(request)
            del self.requests[request.request_id]
            del self._streams[request.request_id]
        return output

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of usable KV blocks referenced by live requests (stats().kv_cache_usage)."""
        return self.kv_cache_manager.usage

    @property
    def cache_capacity_tokens(self) -> int:
        """KV blocks x block size, as vllm:cache_config_info reports them."""
        return self.config.num_gpu_blocks * self.config.block_size

    def decode_run_length(self) -> int:
        """Steps from the next `schedule()` that decode the same requests, none finishing before
        the last, if nothing is added or aborted (0 when the next step is not such a step)."""
        if self._in_flight or self.waiting:
            return 0
        return _decode_run.decode_run_length(self.running, self.config.max_num_batched_tokens, self.kv_cache_manager)

    def decode_run_batch(self) -> tuple[StepBatch, int]:
        """The next decode run's first batch and the context tokens each later step adds."""
        return decode_run_batch(self.running)

    def kv_cache_usage_after(self, num_steps: int) -> float:
        """KV usage once the next `num_steps` decode-run steps are scheduled, without applying them."""
        return _decode_run.kv_cache_usage_after(self.running, self.kv_cache_manager, num_steps)

    def apply_decode_steps(self, num_steps: int) -> None:
        """Apply the next `num_steps` steps at once, exactly as schedule() and finish_step() would;
        only for fewer steps than `decode_run_length()`, so none finishes a request."""
        if num_steps <= 0:
            return
        running = self.running
        starts = [r.num_tokens for r in running]
        for request in running:
            request.output_token_ids.extend(next_token_ids(self._streams[request.request_id], num_steps))
        _decode_run.apply_decode_steps(self.kv_cache_manager, running, starts, num_steps)
        self._next_step_id += num_steps
        self._totals["steps"] += num_steps
        self._totals["generation"] += num_steps * len(running)

    def stats(self) -> SchedulerStats:
        """Gauges and counters as of now."""
        cache = self.kv_cache_manager.prefix_cache_stats
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage,
            prefix_cache_queries=cache.queries,
            prefix_cache_hits=cache.hits,
            num_preemptions=self._totals["preemptions"],
            prompt_tokens_total=self._totals["prompt"],
            prompt_tokens_cached_total=cache.hits,
            prompt_tokens_computed_total=self._totals["computed"],
            generation_tokens_total=self._totals["generation"],
            num_steps=self._totals["steps"],
            num_aborted=self._totals["aborted"],
            running_lora_adapters=tuple(sorted({r.lora for r in self.running if r.lora})),
            waiting_lora_adapters=tuple(sorted({r.lora for r in self.waiting if r.lora})),
        )

    def has_unfinished_requests(self) -> bool:
        """True while any request is queued or running."""
        return bool(self.waiting or self.running)

    def take_kv_events(self) -> list[KVEvent]:
        """KV cache events since the last call, oldest first; [] unless enable_kv_cache_events.

        vLLM's scheduler takes them once per step, after the step's update, into one batch."""
        return self.kv_cache_manager.take_events()

    def reset_prefix_cache(self) -> bool:
        """vLLM's `reset_prefix_cache()`: forget every cached block when no request holds blocks
        (False otherwise, nothing changed); the AllBlocksCleared event goes out with the next step."""
        return self.kv_cache_manager.reset_prefix_cache()

    def cached_block_hashes(self) -> list[int]:
        """The published (external) hashes of the blocks in the prefix cache, sorted, each once."""
        return sorted({external_block_hash(h) for h in self.kv_cache_manager.cached_block_hashes()})
