"""The step API both look-alike schedulers implement; drivers (live or simulated) call only this."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fake_engines.core._request import EngineRequest, RequestOutput, ScheduledStep, SchedulerStats
from fake_engines.perf.batch import StepBatch
from flotilla.kv_events import KVEvent


class EngineCore(Protocol):
    """A clock-free engine scheduler: the driver decides when steps happen and how long they take.

    A driver loops: `step = schedule()`; if None, wait for a request; else ask the perf model
    how long `step.batch` takes, let that time pass, then `finish_step(step)`. With pipeline
    parallelism it may call `schedule()` again before earlier steps finish, up to
    `max_concurrent_batches` steps in flight.
    """

    max_concurrent_batches: int
    """Steps that may be in flight at once (vLLM pipeline-parallel size, or 2 under async
    scheduling; 1 for llama.cpp)."""

    async_scheduling: bool
    """vLLM's async scheduling: the next step is scheduled while this one runs and starts when
    it ends (steps do not overlap as pipeline stages do); False for llama.cpp."""

    @property
    def holds_step_at_schedule(self) -> bool:
        """Whether a step's KV is taken when it is scheduled (vLLM blocks) rather than when it
        finishes (llama.cpp cells)."""
        ...

    @property
    def cache_capacity_tokens(self) -> int | None:
        """KV blocks x block size as vllm:cache_config_info reports them; None without a block cache."""
        ...

    @property
    def running(self) -> Sequence[EngineRequest]:
        """Requests being served, in scheduling order."""
        ...

    @property
    def waiting(self) -> Sequence[EngineRequest]:
        """Requests queued, oldest first."""
        ...

    @property
    def kv_cache_usage(self) -> float:
        """`stats().kv_cache_usage` without building the rest of the snapshot."""
        ...

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; raises RequestRejected when it can never fit the context."""
        ...

    def abort_request(self, request_id: str) -> bool:
        """Drop a request and free its KV blocks or slot now; False if it is unknown or finished.

        No RequestOutput is produced for an aborted request; its in-flight step skips it."""
        ...

    def schedule(self) -> ScheduledStep | None:
        """Build the next step, or None when nothing can run (idle, or all work in flight)."""
        ...

    def finish_step(self, step: ScheduledStep) -> list[RequestOutput]:
        """Apply a finished step: advance its requests, emit tokens, free finished requests."""
        ...

    def stats(self) -> SchedulerStats:
        """Gauges and counters as of now."""
        ...

    def has_unfinished_requests(self) -> bool:
        """True while any request is queued or running."""
        ...

    def take_kv_events(self) -> list[KVEvent]:
        """vLLM's KV cache events (flotilla.kv_events) queued since the last call, oldest first,
        and an empty queue; [] when events are off (the default) or the engine has none (llama.cpp).
        A driver calls it after each `finish_step` (and after `apply_decode_steps`, whose events
        are those of all the steps it applied) and publishes a non-empty list as one batch."""
        ...

    # -- decode runs: a driver may apply a stretch of identical decode-only steps at once ------

    def decode_run_length(self) -> int:
        """Steps from the next `schedule()` that decode the same requests, none finishing before
        the last, if nothing is added or aborted; 0 when the next step is not such a step."""
        ...

    def decode_run_batch(self) -> tuple[StepBatch, int]:
        """The next decode run's first batch and the context tokens each later step adds."""
        ...

    def kv_cache_usage_after(self, num_steps: int) -> float:
        """KV usage once the next `num_steps` decode-run steps are scheduled, without applying them."""
        ...

    def apply_decode_steps(self, num_steps: int) -> None:
        """Apply the next `num_steps` steps at once, exactly as `schedule()` and `finish_step()`
        would; fewer than `decode_run_length()`, so none finishes a request. The run's last step
        goes through `schedule()` and `finish_step()`."""
        ...
