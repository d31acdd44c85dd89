"""llama-server slots: a deferred FIFO, slot choice by prompt similarity or LRU, per-slot prompt reuse."""

from __future__ import annotations

from fake_engines.core._config import LlamaCppSchedulerConfig
from fake_engines.core._request import EngineRequest, RequestOutput, ScheduledStep, SchedulerStats


class LlamaCppScheduler:
    """The EngineCore of the llama-server look-alike."""

    def __init__(self, config: LlamaCppSchedulerConfig) -> None:
        self.config = config
        self.max_concurrent_batches = 1

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; RequestRejected when the prompt does not fit a slot's context."""
        raise NotImplementedError

    def abort_request(self, request_id: str) -> bool:
        """Drop a request and free its slot now; False when unknown or already finished."""
        raise NotImplementedError

    def schedule(self) -> ScheduledStep | None:
        """One iteration: a token per generating slot, then prompt chunks, one LoRA configuration only."""
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
