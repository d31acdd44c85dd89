"""Turns driver events into vLLM metric updates (what vLLM's StatLoggers do after each step)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from fake_engines.core import EngineCore, FinishReason, SchedulerStats
from fake_engines.driver.live import RequestHandle, StepReport
from fake_engines.vllm.metrics import FinishedRecord, StepRecord, VllmMetrics


@dataclass(frozen=True)
class RequestParams:
    """Sampling parameters vLLM records per finished request."""

    max_tokens_param: int | None
    """max_tokens as the client sent it (None when omitted)."""
    max_tokens: int
    """The output budget applied."""
    n: int = 1
    """The n parameter."""
    parent: bool = True
    """True for the first sample of a request: n and the budget are observed once per request."""


class VllmTelemetry:
    """A DriverObserver that keeps VllmMetrics in step with the core."""

    def __init__(self, metrics: VllmMetrics, core: EngineCore, engine: str = "0") -> None:
        self.metrics = metrics
        self.core = core
        self.engine = engine
        self.params: dict[str, RequestParams] = {}
        self._last = core.stats()
        self._lora_order: dict[str, None] = {}

    def on_step(self, report: StepReport) -> None:
        """Counters by delta of the core's totals; latencies from the driver's timestamps."""
        stats = self.core.stats()
        self.metrics.record_step(self._step_record(report, stats), self.engine)
        self._record_lora(stats)
        for out in report.outputs:
            if out.finished and out.request_id in report.handles:
                self._finish(report.handles[out.request_id], out.finish_reason)
        self._last = stats

    def on_abort(self, handle: RequestHandle, now_s: float) -> None:
        """vLLM counts the aborted request's tokens already produced but no request_success."""
        self.params.pop(handle.request.request_id, None)
        stats = self.core.stats()
        self.metrics.record_step(self._delta_record(stats, iteration_tokens=0, ttfts=[], itls=[]), self.engine)
        self._record_lora(stats)
        self._last = stats

    def refresh(self) -> None:
        """The gauges again after the core changed between steps (P/D: held blocks freed)."""
        stats = self.core.stats()
        self.metrics.record_step(self._delta_record(stats, iteration_tokens=0, ttfts=[], itls=[]), self.engine)
        self._last = stats

    def on_stopped(self, handle: RequestHandle, now_s: float) -> None:
        """A stop string finished the request: vLLM counts it as finished with reason stop."""
        stats = self.core.stats()
        self.metrics.record_step(self._delta_record(stats, iteration_tokens=0, ttfts=[], itls=[]), self.engine)
        self._last = stats
        self._finish(handle, FinishReason.STOP)

    def _step_record(self, report: StepReport, stats: SchedulerStats) -> StepRecord:
        ttfts = [report.finished_s - report.handles[o.request_id].times.arrival_s
                 for o in report.outputs if o.is_first_token and o.request_id in report.handles]
        itls = [report.finished_s - prev for prev in report.previous_token_s.values()]
        record = self._delta_record(stats, report.step.batch.tokens, ttfts, itls)
        loaded = [report.handles[rid].request for rid in report.step.new_request_ids
                  if rid in report.handles and report.handles[rid].request.remote_prefill]
        if loaded:
            record = dataclasses.replace(record, external_queries_tokens=sum(r.num_prompt_tokens for r in loaded),
                                         external_hits_tokens=sum(r.num_external_tokens for r in loaded))
        return record

    def _delta_record(self, stats: SchedulerStats, iteration_tokens: int, ttfts: list[float],
                      itls: list[float]) -> StepRecord:
        last = self._last
        return StepRecord(
            iteration_tokens=iteration_tokens,
            prompt_tokens=stats.prompt_tokens_total - last.prompt_tokens_total,
            generation_tokens=stats.generation_tokens_total - last.generation_tokens_total,
            ttfts_s=ttfts, itls_s=itls,
            preemptions=stats.num_preemptions - last.num_preemptions,
            prefix_queries_tokens=stats.prefix_cache_queries - last.prefix_cache_queries,
            prefix_hits_tokens=stats.prefix_cache_hits - last.prefix_cache_hits,
            num_running=stats.num_running, num_waiting=stats.num_waiting, kv_cache_usage=stats.kv_cache_usage)

    def _record_lora(self, stats: SchedulerStats) -> None:
        # vLLM's LoRARequestStates: one entry per adapter with a waiting or running request, in the
        # order adapters got one, and both labels list every entry (so an adapter that runs is
        # listed as waiting too, as the real gauge shows)
        live = {*stats.running_lora_adapters, *stats.waiting_lora_adapters}
        for name in [name for name in self._lora_order if name not in live]:
            del self._lora_order[name]
        for name in sorted(live - self._lora_order.keys()):
            self._lora_order[name] = None
        adapters = list(self._lora_order)
        self.metrics.record_lora(adapters, adapters, time.time())

    def _finish(self, handle: RequestHandle, reason: FinishReason | None) -> None:
        request, times = handle.request, handle.times
        params = self.params.pop(request.request_id, RequestParams(None, request.max_tokens))
        end = times.finished_s or 0.0
        scheduled = times.scheduled_s if times.scheduled_s is not None else times.arrival_s
        first = times.first_token_s if times.first_token_s is not None else end
        self.metrics.record_finished(FinishedRecord(
            finished_reason=(reason or FinishReason.STOP).value, prompt_tokens=request.num_prompt_tokens,
            generation_tokens=len(request.output_token_ids), max_tokens_param=params.max_tokens_param,
            max_num_generation_tokens=params.max_tokens, n_param=params.n if params.parent else None,
            e2e_s=end - times.arrival_s,
            queue_s=scheduled - times.arrival_s, prefill_s=first - scheduled, decode_s=end - first,
            num_preemptions=request.num_preemptions,
            prefill_computed_tokens=request.num_prompt_tokens - (request.num_cached_tokens or 0)), self.engine)
