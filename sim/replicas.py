"""Engine replicas under virtual time.

`CoreReplica` drives the real engine core (`fake_engines.core`) with step times from the real
perf model; `FixedReplica` serves one request at a time for the trace's service time, for
queueing what-ifs such as the seed lesson's Example 9. Both report progress through the
`Listener` callbacks so the fleet can fill the loadgen result records.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from fake_engines.core import EngineCore, EngineRequest, RequestOutput, RequestRejected, ScheduledStep
from fake_engines.perf.batch import StepBatch
from flotilla.kv_events import KVEvent
from sim.events import Event, EventQueue, Phase, instant
from sim.grid import step_ends_s


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
    kv_transfer_hold: bool = False
    """P/D prefill side: the engine holds the finished request's KV blocks for a pull."""
    remote_prefill: bool = False
    """P/D decode side: the prompt's KV comes from a prefill engine; the request waits in
    WAITING_FOR_REMOTE_KVS until the pull ends (`CoreReplica.wake`)."""


class Listener(Protocol):
    """Progress reports: tokens one at a time, a decode run's later tokens (never a first token)
    in one call, and the finish."""

    def on_token(self, job: SimJob, now_s: float, first: bool) -> None: ...

    def on_tokens(self, job: SimJob, times_s: Sequence[float]) -> None: ...

    def on_finish(self, job: SimJob, now_s: float, prompt_tokens: int, cached_tokens: int,
                  completion_tokens: int) -> None: ...

    def on_reject(self, job: SimJob, now_s: float, message: str) -> None: ...


@dataclass(frozen=True)
class ReplicaMetrics:
    """What a scrape of the replica's /metrics would show."""

    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage: float


class FixedReplica:
    """Serves one request at a time, first come first served, for its `service_time_s`."""

    cache_capacity_tokens: int | None = None  # no prefix cache

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
DecodeRunTime = Callable[[StepBatch, int, int], Sequence[float] | npt.NDArray[np.float64]]
"""(first batch, context tokens added per step, steps) -> each step's seconds (a list, or a float64
array as `fake_engines.perf.step_time.decode_run_array_s` gives)."""


def stepwise_run_time(step_time: StepTime) -> DecodeRunTime:
    """A decode run's step times asked of `step_time` step by step: exact for any step-time
    model, where no vectorised one (`fake_engines.perf.step_time.decode_run_array_s`) is at hand."""

    def run_time(first: StepBatch, context_step: int, num_steps: int) -> list[float]:
        start = first.decode_context_tokens
        return [step_time(replace(first, decode_context_tokens=start + i * context_step)) for i in range(num_steps)]

    return run_time


@dataclass
class _DecodeRun:
    """Identical decode steps in flight as one event; applied to the core when they end or
    when someone looks at the replica before then."""

    end_s: list[float]
    """Virtual end of each step, on the event queue's nanosecond grid."""
    jobs: list[SimJob]
    """The decoding requests, in scheduling order."""


KVEventSink = Callable[[int, list[KVEvent], float], None]
"""(replica index, the KV events of one engine step, the step's end in virtual seconds)."""


class CoreReplica:
    """The real engine core, stepped whenever it has work; each step lasts `step_time(batch)`.

    With `queue` and `decode_run_time`, a stretch of identical decode-only steps (see the core's
    `decode_run_length`) becomes one event; submitting or reading metrics before it ends first
    applies the steps finished by then and turns the one under way into an ordinary step, so
    everything observed is as if the steps had run one event each.

    With `kv_events` (a core built with KV cache events on) the events each step queued go to
    the sink when the step ends, as vLLM publishes one batch per step. Decode runs are then off:
    a run applies its steps in bulk when it ends or is interrupted, which would date the events
    of its steps late, so every step is its own event (the same results, about 2.5 times the
    simulation time on decode-heavy traces)."""

    def __init__(self, index: int, core: EngineCore, step_time: StepTime, listener: Listener,
                 queue: EventQueue | None = None, decode_run_time: DecodeRunTime | None = None,
                 kv_events: KVEventSink | None = None, text_prefix: tuple[int, ...] = ()) -> None:
        self.index = index
        self.core = core
        self.text_prefix = text_prefix
        """Tokens the engine puts before a text prompt (llama-server's BOS), which the job's ids lack."""
        self.step_time = step_time
        self.listener = listener
        self.jobs: dict[str, SimJob] = {}
        self.in_flight_steps = 0
        self.next_launch_s = 0.0  # with pipeline parallelism, when stage 0 is free again
        self.last_end_s = 0.0  # under async scheduling, when the GPU is free again
        self.launch_pending = False
        self.queue = queue
        self.decode_run_time = decode_run_time
        self.kv_events = kv_events
        self.runs = (queue is not None and decode_run_time is not None and core.max_concurrent_batches == 1
                     and kv_events is None)
        self._run: _DecodeRun | None = None
        self.cache_capacity_tokens = core.cache_capacity_tokens
        """KV blocks x block size, as the proxy reads it from vllm:cache_config_info (None for llama.cpp)."""

    def submit(self, job: SimJob, now_s: float) -> list[Event]:
        events = self._interrupt_run(now_s)
        req_id = str(job.index)
        try:
            self.core.add_request(EngineRequest(
                request_id=req_id, prompt_token_ids=[*self.text_prefix, *job.prompt_token_ids] if self.text_prefix
                else job.prompt_token_ids, max_tokens=job.output_len,
                output_len=job.output_len, lora=job.lora, arrival_s=job.arrival_s,
                kv_transfer_hold=job.kv_transfer_hold, remote_prefill=job.remote_prefill,
                waiting_for_remote_kvs=job.remote_prefill))
        except RequestRejected as exc:  # the engine answers 400 at once and the steps go on
            self.listener.on_reject(job, now_s, exc.message)
        else:
            self.jobs[req_id] = job
        return events + self._launch(now_s)

    def wake(self, now_s: float, change: Callable[[], object]) -> list[Event]:
        """Apply `change` to the core from outside a step (a KV pull ended, held blocks freed)
        as a submit would: the decode run under way is cut at `now_s` first, then steps launch."""
        events = self._interrupt_run(now_s)
        change()
        return events + self._launch(now_s)

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
        if self.runs and (run_events := self._start_run(now_s)):
            return run_events
        step = self.core.schedule()
        if step is None:
            return events
        # a step lasts whole nanoseconds, so a chain of steps is an exact sum (see sim.grid)
        duration_s = instant(self.step_time(step.batch))
        self.in_flight_steps += 1
        if self.core.async_scheduling:
            # vLLM's engine core schedules the next step while this one runs, and the GPU runs
            # it when this one ends (a batch queue of two, not overlapping pipeline stages)
            end_s = self.last_end_s = instant(max(now_s, self.last_end_s) + duration_s)
            events.append(Event(end_s, Phase.COMPLETION, lambda t: self._finish(step, t)))
            return events + self._launch(now_s)
        self.next_launch_s = instant(now_s + instant(duration_s / self.core.max_concurrent_batches))
        events.append(Event(now_s + duration_s, Phase.COMPLETION, lambda t: self._finish(step, t)))
        if self.core.max_concurrent_batches > 1:
            events.extend(self._launch(now_s))
        return events

    # -- decode runs ------------------------------------------------------------------------

    def _start_run(self, now_s: float) -> list[Event]:
        core = self.core
        num_steps = core.decode_run_length()
        if num_steps < 2:
            return []
        assert self.decode_run_time is not None
        first, context_step = core.decode_run_batch()
        end_s = step_ends_s(now_s, self.decode_run_time(first, context_step, num_steps))
        run = self._run = _DecodeRun(end_s, [self.jobs[r.request_id] for r in core.running])
        self.in_flight_steps += 1
        self.next_launch_s = end_s[-1]
        return [Event(end_s[-1], Phase.COMPLETION, lambda t: self._finish_run(run, t))]

    def _apply_run_steps(self, run: _DecodeRun, num_steps: int) -> None:
        self.core.apply_decode_steps(num_steps)
        times_s = run.end_s[:num_steps]
        for job in run.jobs:
            self.listener.on_tokens(job, times_s)

    def _finish_run(self, run: _DecodeRun, now_s: float) -> list[Event]:
        if run is not self._run:
            return []  # interrupted: its steps were applied and the one under way rescheduled
        self._run = None
        self._apply_run_steps(run, len(run.end_s) - 1)
        step = self.core.schedule()
        assert step is not None
        return self._finish(step, now_s)

    def _interrupt_run(self, now_s: float) -> list[Event]:
        """Apply the run's steps that ended by `now_s`; the one under way becomes an ordinary step."""
        run = self._run
        if run is None:
            return []
        self._run = None
        done = bisect.bisect_right(run.end_s, now_s)
        self.next_launch_s = end_s = run.end_s[done]
        core = self.core
        if done + 1 < len(run.end_s) and core.holds_step_at_schedule:
            # the step under way finishes no request, so the core takes it with the others now
            # (its blocks are held from now, as when scheduled); its tokens are reported when it ends
            core.apply_decode_steps(done + 1)
            times_s = run.end_s[:done]
            for job in run.jobs:
                self.listener.on_tokens(job, times_s)
            return [Event(end_s, Phase.COMPLETION, lambda t: self._finish_applied(run.jobs, t))]
        self._apply_run_steps(run, done)
        step = self.core.schedule()
        assert step is not None
        return [Event(end_s, Phase.COMPLETION, lambda t: self._finish(step, t))]

    def _finish_applied(self, jobs: list[SimJob], now_s: float) -> list[Event]:
        """The end of a decode step the core has already applied: only its tokens to report."""
        self.in_flight_steps -= 1
        times_s = [now_s]
        for job in jobs:
            self.listener.on_tokens(job, times_s)
        return self._launch(now_s)

    def _retry_launch(self, now_s: float) -> list[Event]:
        self.launch_pending = False
        return self._launch(now_s)

    def _finish(self, step: ScheduledStep, now_s: float) -> list[Event]:
        self.in_flight_steps -= 1
        for out in self.core.finish_step(step):
            self._deliver(out, now_s)
        if self.kv_events is not None and (events := self.core.take_kv_events()):
            self.kv_events(self.index, events, now_s)
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
        core = self.core
        if self._run is not None and self.queue is not None:
            # mid-run only KV usage moves: the steps ended by now plus the one under way hold blocks
            done = bisect.bisect_right(self._run.end_s, self.queue.now_s)
            return ReplicaMetrics(len(core.running), len(core.waiting), core.kv_cache_usage_after(done + 1))
        if self.runs:  # a core with decode runs: its three gauges without a whole stats snapshot
            return ReplicaMetrics(len(core.running), len(core.waiting), core.kv_cache_usage)
        s = core.stats()
        return ReplicaMetrics(s.num_running, s.num_waiting, s.kv_cache_usage)
