"""Driver events to llama-server's server_metrics (updated where llama-server updates them)."""

from __future__ import annotations

from fake_engines.core import EngineCore
from fake_engines.driver.live import RequestHandle, StepReport
from fake_engines.llamacpp.metrics import LlamaCounters
from fake_engines.llamacpp.shapes import Timings


def request_timings(handle: RequestHandle, now_s: float) -> Timings:
    """timings of a request: prompt from slot launch to first token, generation after that."""
    request, times = handle.request, handle.times
    launched = times.scheduled_s if times.scheduled_s is not None else times.arrival_s
    first = times.first_token_s if times.first_token_s is not None else now_s
    end = times.finished_s if times.finished_s is not None else now_s
    cached = request.num_cached_tokens or 0
    return Timings(cache_n=cached, prompt_n=request.num_prompt_tokens - cached, prompt_ms=(first - launched) * 1e3,
                   predicted_n=len(request.output_token_ids), predicted_ms=(end - first) * 1e3)


class LlamaTelemetry:
    """A DriverObserver keeping LlamaCounters: prompt totals when a prompt ends, predictions when a task ends."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.counters = LlamaCounters()
        self._steps = 0
        self._busy = 0

    def on_step(self, report: StepReport) -> None:
        """n_decode per step; prompt and prediction totals at the moments llama-server counts them."""
        stats = self.core.stats()
        self.counters.n_decode += stats.num_steps - self._steps
        self.counters.n_busy_slots_total += stats.n_busy_slots_total - self._busy
        self._steps, self._busy = stats.num_steps, stats.n_busy_slots_total
        self.counters.n_tokens_max = max(self.counters.n_tokens_max, stats.n_tokens_max)
        for out in report.outputs:
            handle = report.handles.get(out.request_id)
            if handle is None:
                continue
            if out.is_first_token:
                t = request_timings(handle, report.finished_s)
                self.counters.on_prompt_done(t.prompt_n, t.cache_n, t.prompt_ms / 1e3)
            if out.finished:
                self._request_done(handle, report.finished_s)

    def on_abort(self, handle: RequestHandle, now_s: float) -> None:
        """A cancelled task still adds the tokens it decoded."""
        self._request_done(handle, now_s)

    def on_stopped(self, handle: RequestHandle, now_s: float) -> None:
        """A stop string ended the task."""
        self._request_done(handle, now_s)

    def _request_done(self, handle: RequestHandle, now_s: float) -> None:
        t = request_timings(handle, now_s)
        self.counters.on_request_done(t.predicted_n, t.predicted_ms / 1e3, handle.request.num_tokens)
