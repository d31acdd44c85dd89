"""vLLM V1 scheduling: a token budget per step, chunked prefill, FIFO admission, recompute preemption."""

from __future__ import annotations

from fake_engines.core._config import VllmSchedulerConfig
from fake_engines.core._request import EngineRequest, RequestOutput, ScheduledStep, SchedulerStats


class VllmScheduler:
    """The EngineCore of the vLLM look-alike."""

    def __init__(self, config: VllmSchedulerConfig) -> None:
        self.config = config
        self.max_concurrent_batches = config.max_concurrent_batches

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; RequestRejected when prompt + max_tokens exceeds max_model_len."""
        raise NotImplementedError

    def abort_request(self, request_id: str) -> bool:
        """Drop a request and free its blocks now; False when unknown or already finished."""
        raise NotImplementedError

    def schedule(self) -> ScheduledStep | None:
        """Running requests first, then waiting ones FIFO (only in steps with no preemption)."""
        raise NotImplementedError

    def finish_step(self, step: ScheduledStep) -> list[RequestOutput]:
        """Advance the step's requests, emit tokens, free finished requests."""
        raise NotImplementedError

    def stats(self) -> SchedulerStats:
        """Gauges and counters as of now."""
        raise NotImplementedError

    def has_unfinished_requests(self) -> bool:
        """True while any request is queued or running."""
        raise NotImplementedError
