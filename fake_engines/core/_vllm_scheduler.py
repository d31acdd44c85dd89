"""vLLM V1 scheduling: a token budget per step, chunked prefill, FIFO admission, recompute preemption."""

from __future__ import annotations

import bisect
from collections import deque

from fake_engines.core import _decode_run
from fake_engines.core._config import VllmSchedulerConfig
from fake_engines.core._generator import TokenSource, next_token_ids, request_tokens
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


def _priority_key(request: EngineRequest) -> tuple[int, float, str]:
    return request.priority, request.arrival_s, request.request_id


class VllmScheduler:
    """The EngineCore of the vLLM look-alike."""

    holds_step_at_schedule = True
    """A step's KV blocks are taken when it is scheduled."""

    def __init__(self, config: VllmSchedulerConfig) -> None:
        self.config = config
        self.async_scheduling = config.async_scheduling
        # vLLM's engine core keeps a batch queue of two under async scheduling
        self.max_concurrent_batches = 2 if config.async_scheduling else config.max_concurrent_batches
        self.max_model_len: int = config.max_model_len or 0
        self.kv_cache_manager = KVCacheManager(
            config.num_gpu_blocks, config.block_size, config.enable_prefix_caching,
            config.prefix_caching_hash_algo, config.enable_kv_cache_events)
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.requests: dict[str, EngineRequest] = {}
        self.held_for_transfer: dict[str, EngineRequest] = {}
        """P/D prefill side: finished requests whose blocks wait for a decode engine's pull."""
        self._streams: dict[str, TokenSource] = {}
        self._in_flight: dict[int, ScheduledStep] = {}
        self._in_flight_ids: set[str] = set()
        self._next_step_id = 0
        self._threshold = config.long_prefill_token_threshold
        self._priority = config.scheduling_policy == "priority"
        # async scheduling, per request: tokens scheduled in steps in flight (vLLM's
        # num_in_flight_tokens), tokens those steps will sample (num_output_placeholders), and
        # in-flight tokens of a request preempted meanwhile (num_stale_output_tokens)
        self._ahead: dict[str, int] = {}
        self._placeholders: dict[str, int] = {}
        self._stale: dict[str, int] = {}
        self._samples: dict[int, set[str]] = {}
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
        self._streams[request.request_id] = request_tokens(self.config.seed, request.request_id, request.sampling)
        self._enqueue(request, front=False)

    def _enqueue(self, request: EngineRequest, front: bool) -> None:
        """FCFS: at the back, or at the front for a preempted request. Priority: in order of
        (priority, arrival, request id), as vLLM's heap pops them."""
        if self._priority:
            bisect.insort(self.waiting, request, key=_priority_key)
        elif front:
            self.waiting.appendleft(request)
        else:
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
        self._forget_async(request_id)
        self._totals["aborted"] += 1
        return True

    def schedule(self) -> ScheduledStep | None:
        """Running requests first, then waiting ones FIFO (only in steps with no preemption)."""
        if len(self._in_flight) >= self.max_concurrent_batches:
            return None
        builder = StepBuilder(token_budget=self.config.max_num_batched_tokens)
        # vLLM: the cap stops a long prefill starving others, so it is off while there are none
        threshold = self.config.long_prefill_token_threshold
        self._threshold = threshold if len(self.running) + len(self.waiting) > 1 else 0
        if self.async_scheduling:
            self._schedule_running_async(builder)
        else:
            self._schedule_running(builder)
        if not builder.preempted_request_ids:
            self._schedule_waiting(builder)
        self._check_invariants(builder)
        if not builder.num_scheduled_tokens:
            return None
        step = builder.build(self._next_step_id)
        self._next_step_id += 1
        self._in_flight[step.step_id] = step
        if self.async_scheduling:
            self._after_schedule_async(step)
        else:
            self._in_flight_ids.update(step.num_scheduled_tokens)
        return step

    def _schedule_running_async(self, builder: StepBuilder) -> None:
        """vLLM's AsyncScheduler: a running request is scheduled again while its previous step is
        in flight, for the token that step will sample (a placeholder), unless that step
        already reaches max_tokens."""
        index = 0
        while index < len(self.running) and builder.token_budget > 0:
            request = self.running[index]
            rid = request.request_id
            placeholders = self._placeholders.get(rid, 0)
            computed = request.num_computed_tokens + self._ahead.get(rid, 0)
            if placeholders and computed + 2 - placeholders >= request.num_prompt_tokens + request.max_tokens:
                index += 1
                continue
            num_new = request.num_tokens + placeholders - computed
            if self._threshold:
                num_new = min(num_new, self._threshold)
            num_new = min(num_new, builder.token_budget, self.max_model_len - computed - 1)
            if num_new <= 0:
                index += 1
                continue
            if not self._allocate_or_preempt(request, num_new, index, builder, computed):
                return
            builder.add(request, num_new, computed)
            index = self.running.index(request) + 1 if self._priority else index + 1

    def _after_schedule_async(self, step: ScheduledStep) -> None:
        """vLLM's `_update_after_schedule`: the step's tokens count as computed, and a request
        whose step completes its known tokens gets a placeholder for the token it samples."""
        samples = set()
        for rid, num_new in step.num_scheduled_tokens.items():
            request = self.requests[rid]
            ahead = self._ahead.get(rid, 0)
            placeholders = self._placeholders.get(rid, 0)
            if request.num_computed_tokens + ahead + num_new >= request.num_tokens + placeholders:
                self._placeholders[rid] = placeholders + 1
                samples.add(rid)
            self._ahead[rid] = ahead + num_new
        self._samples[step.step_id] = samples

    def num_scheduled_computed_tokens(self, request_id: str) -> int:
        """vLLM's `num_computed_tokens`: the request's computed tokens plus those of its steps in
        flight (under async scheduling, a step is counted when it is scheduled)."""
        return self.requests[request_id].num_computed_tokens + self._ahead.get(request_id, 0)

    def _forget_async(self, request_id: str) -> None:
        if self.async_scheduling:
            for counts in (self._ahead, self._placeholders, self._stale):
                counts.pop(request_id, None)

    def _num_new_tokens(self, request: EngineRequest, num_computed: int, budget: int) -> int:
        num_new = request.num_tokens - num_computed
        if self._threshold:
            num_new = min(num_new, self._threshold)
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
            # a priority preemption may take a request before this one out of the list
            index = self.running.index(request) + 1 if self._priority else index + 1

    def _allocate_or_preempt(self, request: EngineRequest, num_new: int, index: int,
                             builder: StepBuilder, num_computed: int | None = None) -> bool:
        """Allocate for the request, preempting the newest others until it fits; False if it was the victim."""
        while self.kv_cache_manager.allocate_slots(request, num_new, None, 0, num_computed) is None:
            victim = self._lowest_priority() if self._priority else self._newest_preemptible(index)
            if victim.request_id in builder.num_scheduled_tokens:
                builder.remove(victim)  # vLLM gives back its tokens and unschedules it
            self._preempt(victim, builder)
            if victim is request:
                return False
        return True

    def _lowest_priority(self) -> EngineRequest:
        """vLLM's priority victim: the running request with the largest (priority, arrival)
        that is not in an unfinished step."""
        candidates = [r for r in self.running if r.request_id not in self._in_flight_ids]
        return max(candidates, key=lambda r: (r.priority, r.arrival_s))

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
        if self.async_scheduling:  # its steps in flight still deliver their tokens, stale
            self._stale[request.request_id] = self._ahead.get(request.request_id, 0)
            self._placeholders.pop(request.request_id, None)
        request.num_preemptions += 1
        self._totals["preemptions"] += 1
        self._enqueue(request, front=True)
        builder.preempted_request_ids.append(request.request_id)

    def _lora_blocked(self, request: EngineRequest, loras: set[str]) -> bool:
        """True when admitting the request would bring one adapter too many.

        Counted, as vLLM does, over the requests scheduled in this step (a running request left
        out for lack of budget does not count), so no step holds more than max_loras adapters."""
        return (request.lora is not None and request.lora not in loras
                and len(loras) >= self.config.max_loras)

    def _schedule_waiting(self, builder: StepBuilder) -> None:
        """Admit queued requests in FIFO order while budget, sequence slots and KV blocks last."""
        loras = set(builder.lora_adapters)
        skipped: list[EngineRequest] = []
        while self.waiting and builder.token_budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if (self._lora_blocked(request, loras) or (self._stale and self._stale.get(request.request_id))
                    or request.waiting_for_remote_kvs):  # vLLM skips a request whose KV is still in transit
                # vLLM: nor may a preempted request resume before its stale output arrives
                skipped.append(self.waiting.popleft())
                continue
            if not self._admit(request, builder):
                break
            if request.lora is not None:
                loras.add(request.lora)
        for request in reversed(skipped):
            self._enqueue(request, front=True)

    def _admit(self, request: EngineRequest, builder: StepBuilder) -> bool:
        """Look up the prefix cache, allocate, and move the queue head to running; False if KV is full."""
        hits, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(request)
        loaded = self._num_loaded_tokens(request, num_hit_tokens)
        num_new = self._num_new_tokens(request, num_hit_tokens + loaded, builder.token_budget)
        full = min(request.num_tokens, self.max_model_len) if self.config.scheduler_reserve_full_isl else 0
        if self.kv_cache_manager.allocate_slots(request, loaded + num_new, hits, full) is None:
            return False
        request.num_external_tokens = loaded
        self.kv_cache_manager.record_prefix_cache_stats(request, num_hit_tokens)
        self.waiting.popleft()
        if request.status is RequestStatus.PREEMPTED:
            builder.resumed_request_ids.append(request.request_id)
        else:
            builder.new_request_ids.append(request.request_id)
        if request.num_cached_tokens is None:  # vLLM counts loaded tokens as cached too
            request.num_cached_tokens = num_hit_tokens + loaded
        request.num_computed_tokens = num_hit_tokens + loaded
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        builder.add(request, num_new)
        return True

    @staticmethod
    def _num_loaded_tokens(request: EngineRequest, num_hit_tokens: int) -> int:
        """Decode side of P/D, first admission: the prompt's tokens past the local hit came from
        the prefill engine, all but the last, which vLLM recomputes to sample the next token
        (`_update_waiting_for_remote_kv`). A preempted request recomputes like any other."""
        if not request.remote_prefill or request.num_preemptions or request.num_cached_tokens is not None:
            return 0
        return max(0, request.num_prompt_tokens - 1 - num_hit_tokens)

    def num_local_hit_tokens(self, request: EngineRequest) -> int:
        """Prompt tokens the prefix cache holds for `request` now (what a decode engine need not pull)."""
        return self.kv_cache_manager.get_computed_blocks(request)[1]

    def finish_remote_kv_load(self, request_id: str) -> bool:
        """The pull of a request's KV ended: it may be scheduled (False when it is gone)."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        request.waiting_for_remote_kvs = False
        return True

    def transfer_block_ids(self, request_id: str) -> list[int]:
        """Block ids a finished prefill request holds for a pull (empty when none)."""
        if request_id not in self.held_for_transfer:
            return []
        return self.kv_cache_manager.get_block_ids(request_id)

    def release_transfer_hold(self, request_id: str) -> bool:
        """Free the blocks a finished prefill request held (pulled, or its lease ran out); False
        when it holds none."""
        request = self.held_for_transfer.pop(request_id, None)
        if request is None:
            return False
        self.kv_cache_manager.free(request)
        return True

    def _free_finished(self, request: EngineRequest) -> None:
        """A finished request's blocks go back to the pool, unless a decode engine will pull them."""
        if request.kv_transfer_hold and request.status in (RequestStatus.FINISHED_LENGTH,
                                                           RequestStatus.FINISHED_STOPPED):
            self.held_for_transfer[request.request_id] = request
        else:
            self.kv_cache_manager.free(request)

    def _check_invariants(self, builder: StepBuilder) -> None:
        assert len(self.running) <= self.config.max_num_seqs
        assert builder.token_budget >= 0
        assert len(builder.lora_adapters) <= self.config.max_loras or not builder.lora_adapters
        assert 0.0 <= self.kv_cache_manager.usage <= 1.0

    def finish_step(self, step: ScheduledStep) -> list[RequestOutput]:
        """Advance the step's requests, emit tokens, free finished requests."""
        if self.async_scheduling:
            return self._finish_step_async(step)
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

    def _finish_step_async(self, step: ScheduledStep) -> list[RequestOutput]:
        """vLLM's AsyncScheduler `update_from_output`: sampled tokens replace placeholders and
        the blocks they fill are cached (before a finished request frees them); a request
        preempted meanwhile still receives its token."""
        del self._in_flight[step.step_id]
        self._totals["steps"] += 1
        samples = self._samples.pop(step.step_id)
        outputs = []
        for rid, num_new in step.num_scheduled_tokens.items():
            request = self.requests.get(rid)
            if request is None:
                continue  # aborted, or finished by the step before
            ahead = self._ahead[rid] - num_new
            self._ahead[rid] = ahead
            stale = self._stale.get(rid, 0)
            if stale:
                self._stale[rid] = stale - num_new
                output = self._deliver_stale(request) if rid in samples else None
            else:
                output = self._advance_async(request, num_new, ahead, rid in samples)
            if output is not None:
                outputs.append(output)
        return outputs

    def _advance_async(self, request: EngineRequest, num_new: int, ahead: int, samples: bool) -> RequestOutput | None:
        if not is_decode(request, num_new):
            self._totals["computed"] += num_new
        output = advance_request(request, num_new, self._streams[request.request_id])
        if samples:
            self._placeholders[request.request_id] -= 1
        if output is None:
            return None
        self._count_output(request, output)
        known = request.num_computed_tokens + ahead - self._placeholders[request.request_id]
        self.kv_cache_manager.cache_full_blocks(request, min(known, request.num_tokens))
        if output.finished:
            self._finish(request)
        return output

    def _deliver_stale(self, request: EngineRequest) -> RequestOutput | None:
        """The token of a step that was in flight when its request was preempted (vLLM delivers
        it; nothing is cached, the request recomputes it when it resumes)."""
        computed = request.num_computed_tokens
        request.num_computed_tokens = request.num_tokens  # sample now, without crediting compute
        output = advance_request(request, 0, self._streams[request.request_id])
        request.num_computed_tokens = computed
        assert output is not None
        self._count_output(request, output)
        if output.finished:
            self.waiting.remove(request)
            del self.requests[request.request_id]
            del self._streams[request.request_id]
            self._forget_async(request.request_id)
        return output

    def _count_output(self, request: EngineRequest, output: RequestOutput) -> None:
        self._totals["generation"] += len(output.new_token_ids)
        if output.is_first_token:
            self._totals["prompt"] += request.num_prompt_tokens

    def _finish(self, request: EngineRequest) -> None:
        self.running.remove(request)
        self._free_finished(request)
        del self.requests[request.request_id]
        del self._streams[request.request_id]
        self._forget_async(request.request_id)

    def _advance(self, request: EngineRequest, num_new: int) -> RequestOutput | None:
        if not is_decode(request, num_new):
            self._totals["computed"] += num_new
        output = advance_request(request, num_new, self._streams[request.request_id])
        if output is None:
            return None
        self._totals["generation"] += len(output.new_token_ids)
        if output.is_first_token:
            self._totals["prompt"] += request.num_prompt_tokens
        if output.finished:
            self.running.remove(request)
            self._free_finished(request)
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
