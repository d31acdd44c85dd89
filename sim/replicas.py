"""Engine replicas under virtual time.

`CoreReplica` drives the real engine core (`fake_engines.core`) with step times from the real
perf model; `FixedReplica` serves one request at a time for the trace's service time, for
queueing what-ifs such as the seed lesson's Example 9. Both report progress through the
`Listener` callbacks so the fleet can fill the loadgen result records.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from fake_engines.core import EngineCore, EngineRequest, RequestOutput, ScheduledStep
from fake_engines.perf.batch import StepBatch
from sim.events import Event, Phase, instant


@dataclass
class SimJob:
    """One request on its way through a replica."""

    index: int
    """Position in the workload; also the engine request id."""
    arrival_s: float
    """Virtual arrival time, seconds."""
    prompt_token_ids: list[int] = field(default_factory=list)
    """Tokenized prompt (engine replicas only)."""
    output_len: int = 1
    """Tokens to generate."""
    service_time_s: float = 0.0
    """Service time (fixed replicas only)."""
    lora: str | None = None
    """LoRA adapter, if any."""


class Listener(Protocol):
    def on_token(self, job: SimJob, now_s: float, first: bool) -> None: ...

    def on_finish(self, job: SimJob, now_s: float, prompt_tokens: int, cached_tokens: int,
                  completion_tokens: int) -> None: ...


@dataclass(frozen=True)
class ReplicaMetrics:
    """What a scrape of the replica's /metrics would show."""

    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage: float


class FixedReplica:
    """Serves one request at a time, first come first served, for its `service_time_s`."""

    def __init__(self, index: int, listener: Listener) -> None:
        self.index = index
        self.listener = listener
        self.queue: deque[SimJob] = deque()
        self.busy: SimJob | None = None

    def submit(self, job: SimJob, now_s: float) -> list[Event]:
        self.queue.append(job)
        return self._start_next(now_s)

    def _start_next(self, now_s: float) -> list[Event]:
        if self.busy is not None or not self.queue:
            return []
        job = self.busy = self.queue.popleft()
        return [Event(now_s + job.service_time_s, Phase.COMPLETION, lambda t: self._finish(job, t))]

    def _finish(self, job: SimJob, now_s: float) -> list[Event]:
        self.busy = None
        self.listener.on_token(job, now_s, first=True)
        self.listener.on_finish(job, now_s, len(job.prompt_token_ids), 0, job.output_len)
        return self._start_next(now_s)

    def metrics(self) -> ReplicaMetrics:
        return ReplicaMetrics(int(self.busy is not None), len(self.queue), 0.0)


StepTime = Callable[[StepBatch], float]


class CoreReplica:
    """The real engine core, stepped whenever it has work; each step lasts `step_time(batch)`."""

    def __init__(self, index: int, core: EngineCore, step_time: StepTime, listener: Listener) -> None:
        self.index = index
        self.core = core
        self.step_time = step_time
        self.listener = listener
        self.jobs: dict[str, SimJob] = {}
        self.in_flight_steps = 0
        self.next_launch_s = 0.0  # with pipeline parallelism, when stage 0 is free again
        self.launch_pending = False

    def submit(self, job: SimJob, now_s: float) -> list[Event]:
        req_id = str(job.index)
        self.jobs[req_id] = job
        self.core.add_request(EngineRequest(
            request_id=req_id, prompt_token_ids=job.prompt_token_ids, max_tokens=job.output_len,
            output_len=job.output_len, lora=job.lora, arrival_s=job.arrival_s))
        return self._launch(now_s)

    def _launch(self, now_s: float) -> list[Event]:
        """Start as many steps as the pipeline allows; returns their completion events."""
        events: list[Event] = []
        if self.launch_pending:
            return events
        if now_s < self.next_launch_s:
            self.launch_pending = True
            return [Event(self.next_launch_s, Phase.COMPLETION, self._retry_launch)]
        if self.in_flight_steps >= self.core.max_concurrent_batches:
            return events
        step = self.core.schedule()
        if step is None:
            return events
        duration_s = self.step_time(step.batch)
        self.in_flight_steps += 1
        self.next_launch_s = instant(now_s + duration_s / self.core.max_concurrent_batches)
        events.append(Event(now_s + duration_s, Phase.COMPLETION, lambda t: self._finish(step, t)))
        if self.core.max_concurrent_batches > 1:
            events.extend(self._launch(now_s))
        return events

    def _retry_launch(self, now_s: float) -> list[Event]:
        self.launch_pending = False
        return self._launch(now_s)

    def _finish(self, step: ScheduledStep, now_s: float) -> list[Event]:
        self.in_flight_steps -= 1
        for out in self.core.finish_step(step):
            self._deliver(out, now_s)
        return self._launch(now_s)

    def _deliver(self, out: RequestOutput, now_s: float) -> None:
        job = self.jobs.get(out.request_id)
        if job is None:
            return
        if out.new_token_ids:
            self.listener.on_token(job, now_s, first=out.is_first_token)
        if out.finished:
            del self.jobs[out.request_id]
            self.listener.on_finish(job, now_s, out.num_prompt_tokens, out.num_cached_tokens,
                                    out.num_output_tokens)

    def metrics(self) -> ReplicaMetrics:
        s = self.core.stats()
        return ReplicaMetrics(s.num_running, s.num_waiting, s.kv_cache_usage)
