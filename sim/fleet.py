"""The whole fleet under a virtual clock: arrivals, routing, engine steps and metric scrapes.

The routing decision is made by the real policy object on `BackendView` snapshots built from
simulated state, exactly as the proxy builds them from scraped metrics and its own in-flight
accounting. With `scrape_interval_s` set, engine metrics are only as fresh as the last scrape,
which shows what stale load signals do to a policy.
"""

from __future__ import annotations

import functools
import math
import operator
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, overload

from flotilla.kv_events import KVEvent, KVEventBatch
from loadgen.cost import Span, cost_meta
from loadgen.results import RequestRecord, RunResult, Slo
from loadgen.stats import summarize
from loadgen.trace import TraceRequest
from policies.routing.base import BackendView, RequestInfo, RoutingPolicy
from policies.routing.kv_index import KVIndex, KVIndexUser
from policies.scaling import ReplicaState
from sim.autoscale import ReplicaLife, SimAutoscaler
from sim.events import Event, EventQueue, Phase
from sim.replicas import Listener, ReplicaMetrics, SimJob


class Replica(Protocol):
    index: int
    cache_capacity_tokens: int | None

    def submit(self, job: SimJob, now_s: float) -> list[Event]: ...

    def metrics(self) -> ReplicaMetrics: ...


ReplicaFactory = Callable[[int, Listener], Replica]
KV_EVENTS_DELAY_S = 0.005
"""Default seconds from an engine step's end to its KV events reaching the router's index: the
ZMQ hop and the router's decode, a few milliseconds on one host or one rack."""
JobFactory = Callable[[TraceRequest, int], SimJob]


def _url(index: int) -> str:
    """Replica `index`'s backend URL, as its views and the KV index name it."""
    return f"sim://{index}"


@dataclass
class ReplicaLedger:
    """Router-side accounting for one replica, as the proxy keeps it."""

    in_flight: int = 0
    """Requests routed here and not finished."""
    in_flight_tokens: int = 0
    """Their reserved tokens (estimated prompt plus max tokens), as the proxy reserves them."""
    prefill_tokens: int = 0
    """Prompt tokens computed here so far (prompt minus cached), from finished requests."""
    cached_tokens: int = 0
    """Prompt tokens served from this replica's prefix cache."""
    scraped: ReplicaMetrics | None = None
    """Engine metrics as of the last scrape; None before the first."""
    scraped_at_s: float = 0.0


@dataclass
class _Pending:
    request: TraceRequest
    job: SimJob
    record: RequestRecord
    replica: int
    tokens: int
    """Reserved against the replica's ledger until the request ends."""
    predicted_cached_tokens: int | None = None
    """What the policy expected the replica to serve from its prefix cache."""
    last_token_s: float | None = None


@dataclass
class FleetSim:
    """One simulated run of a workload through a routing policy and a fleet of replicas."""

    make_replica: ReplicaFactory
    num_replicas: int
    policy: RoutingPolicy
    make_job: JobFactory
    scrape_interval_s: float | None = None
    """None: policies see exact engine state at every decision."""
    slo: Slo | None = None
    autoscaler: SimAutoscaler | None = None
    """None: a fixed fleet of `num_replicas`; else it starts with them and scales."""
    weights: Sequence[float] = ()
    """Capacity weight of replica i (`BackendView.weight`) for i < len(weights); `default_weight` for the rest."""
    default_weight: float = 1.0
    """Weight of the replicas past `weights`: those an autoscaler adds."""
    gpus_of: Callable[[int], int] = lambda index: 1
    """GPUs replica i holds, for `meta.gpu_seconds`."""
    kv_events_delay_s: float = KV_EVENTS_DELAY_S
    """With a policy that reads a KV index: an engine step's KV events reach it this long after
    the step ends."""
    queue: EventQueue = field(default_factory=EventQueue)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.kv_events_delay_s) and self.kv_events_delay_s >= 0):
            raise ValueError(f"kv_events_delay_s must be a finite number >= 0, got {self.kv_events_delay_s}")
        self.kv_index: KVIndex | None = None
        """The index of the engines' KV events, fed in virtual time; None unless the policy reads one."""
        if isinstance(self.policy, KVIndexUser):
            self.kv_index = KVIndex()
            self.policy.bind_kv_index(self.kv_index)
        self.replicas: list[Replica] = []
        self.ledgers: list[ReplicaLedger] = []
        self.lives: list[ReplicaLife] = []
        self.records: list[RequestRecord] = []
        self.pending: dict[int, _Pending] = {}
        self.held: deque[tuple[int, TraceRequest]] = deque()
        self.decisions: dict[str, int] = {}
        self.replica_counts: list[tuple[float, int]] = []
        self._gaps_of: Sequence[float] | None = None  # the times on_tokens last turned into gaps
        self._gaps = array("d")
        self.prefix_predicted_tokens: int | None = None  # summed over requests the policy predicted
        self.prefix_observed_tokens = 0
        for _ in range(self.num_replicas):
            self._add_replica(0.0, ready=True)

    # -- fleet membership -----------------------------------------------------------------

    def _add_replica(self, now_s: float, ready: bool) -> int:
        index = len(self.replicas)
        self.replicas.append(self.make_replica(index, self))
        if self.kv_index is not None and getattr(self.replicas[-1], "kv_events", None) is not None:
            self.kv_index.add_backend(_url(index))  # it publishes: the policy trusts the index from now
        self.ledgers.append(ReplicaLedger())
        state = ReplicaState.READY if ready else ReplicaState.STARTING
        self.lives.append(ReplicaLife(state, started_at_s=now_s, ready_at_s=now_s if ready else None))
        self._count_replicas(now_s)
        return index

    def _ready(self) -> list[int]:
        return [i for i, life in enumerate(self.lives) if life.state is ReplicaState.READY and life.live]

    def _count_replicas(self, now_s: float) -> None:
        self.replica_counts.append((now_s, len(self._ready())))

    def _become_ready(self, index: int, now_s: float) -> list[Event]:
        life = self.lives[index]
        life.state, life.ready_at_s = ReplicaState.READY, now_s
        self._count_replicas(now_s)
        events: list[Event] = []
        while self.held:
            held_index, req = self.held.popleft()
            events += self._dispatch(held_index, req, now_s)
        return events

    def _drain(self, index: int, now_s: float) -> None:
        self.lives[index].state = ReplicaState.DRAINING
        self._count_replicas(now_s)
        self._stop_if_drained(index, now_s)

    def _stop_if_drained(self, index: int, now_s: float) -> None:
        life = self.lives[index]
        if life.state is ReplicaState.DRAINING and life.live and self.ledgers[index].in_flight == 0:
            life.stopped_at_s = now_s

    # -- arrivals and routing -------------------------------------------------------------

    def run(self, workload: Iterable[TraceRequest], label: str = "sim") -> RunResult:
        arrivals = iter(enumerate(workload))
        self.queue.extend(self._next_arrival(arrivals))
        if self.scrape_interval_s:
            self.queue.push(Event(0.0, Phase.SCRAPE, self._scrape))
        if self.autoscaler:
            self.queue.push(Event(self.autoscaler.policy.interval_s, Phase.SCALE, self._scale))
        self.queue.run()
        return self._result(label)

    def _next_arrival(self, arrivals: Iterator[tuple[int, TraceRequest]]) -> list[Event]:
        item = next(arrivals, None)
        if item is None:
            self._arrivals_done = True
            return []
        self._arrivals_done = False
        index, req = item
        return [Event(req.timestamp_s, Phase.ARRIVAL, lambda t: self._arrive(index, req, t, arrivals))]

    def _arrive(self, index: int, req: TraceRequest, now_s: float,
                arrivals: Iterator[tuple[int, TraceRequest]]) -> list[Event]:
        if self.autoscaler:
            self.autoscaler.arrived(req.input_length or 0, req.output_length)
        if not self._ready():  # scale from zero: hold until a replica is ready
            self.held.append((index, req))
            return self._next_arrival(arrivals)
        return self._dispatch(index, req, now_s) + self._next_arrival(arrivals)

    def _dispatch(self, index: int, req: TraceRequest, now_s: float) -> list[Event]:
        job = self.make_job(req, index)
        info = RequestInfo(model=req.model, prompt_token_ids=tuple(job.prompt_token_ids) or None,
                           session_key=req.session_id, lora=req.lora, request_id=str(index),
                           prompt_tokens=req.input_length or len(job.prompt_token_ids),
                           max_tokens=req.output_length)
        decision = self.policy.select(self._views(now_s), info)
        if decision is None:
            raise RuntimeError(f"policy {self.policy.name} chose no replica for request {index}")
        self.decisions[decision.rule] = self.decisions.get(decision.rule, 0) + 1
        record = RequestRecord(index=index, session_id=req.session_id, backend=str(decision.index),
                               scheduled_time_s=req.timestamp_s, send_time_s=req.timestamp_s,
                               itl_s=array("d"))  # 8 bytes a gap: a long run keeps tens of millions
        job.arrival_s = req.timestamp_s  # latency counts from arrival, time held included
        self.records.append(record)
        tokens = info.prompt_tokens + (info.max_tokens or 0)
        self.pending[index] = _Pending(req, job, record, decision.index, tokens, decision.predicted_cached_tokens)
        ledger = self.ledgers[decision.index]
        ledger.in_flight += 1
        ledger.in_flight_tokens += tokens
        return self.replicas[decision.index].submit(job, now_s)

    def _views(self, now_s: float) -> Sequence[BackendView]:
        return _LazyViews(self, self._ready(), now_s)

    def _view(self, i: int, now_s: float) -> BackendView:
        replica, ledger = self.replicas[i], self.ledgers[i]
        m = replica.metrics() if not self.scrape_interval_s else ledger.scraped
        return BackendView(
            index=i, url=_url(i), weight=self.weights[i] if i < len(self.weights) else self.default_weight,
            in_flight=ledger.in_flight, in_flight_tokens=ledger.in_flight_tokens,
            prefill_tokens=ledger.prefill_tokens, cache_capacity_tokens=replica.cache_capacity_tokens,
            num_requests_running=m.num_requests_running if m else None,
            num_requests_waiting=m.num_requests_waiting if m else None,
            kv_cache_usage=m.kv_cache_usage if m else None,
            metrics_age_s=(now_s - ledger.scraped_at_s) if self.scrape_interval_s and m else 0.0)

    def _scrape(self, now_s: float) -> list[Event]:
        for replica, ledger in zip(self.replicas, self.ledgers, strict=True):
            ledger.scraped, ledger.scraped_at_s = replica.metrics(), now_s
        if self._finished():
            return []
        assert self.scrape_interval_s
        return [Event(now_s + self.scrape_interval_s, Phase.SCRAPE, self._scrape)]

    def _finished(self) -> bool:
        return self._arrivals_done and not self.pending and not self.held

    def _scale(self, now_s: float) -> list[Event]:
        assert self.autoscaler is not None
        live = [i for i, life in enumerate(self.lives) if life.live]
        launch, drain = self.autoscaler.decide(
            now_s, self.lives, [ledger.in_flight for ledger in self.ledgers],
            [self.replicas[i].metrics() for i in self._ready()], len(self.held))
        events: list[Event] = []
        for index in drain:
            if index in live:
                self._drain(index, now_s)
        for _ in range(launch):
            index = self._add_replica(now_s, ready=False)
            events.append(Event(now_s + self.autoscaler.cold_start_s, Phase.COMPLETION,
                                functools.partial(self._become_ready, index)))
        if not self._finished():
            events.append(Event(now_s + self.autoscaler.policy.interval_s, Phase.SCALE, self._scale))
        return events

    # -- Listener: progress reported by the replicas --------------------------------------

    def on_kv_events(self, replica: int, events: list[KVEvent], now_s: float) -> None:
        """One engine step's KV events: applied to the index `kv_events_delay_s` later, as one
        batch, in the order the steps ended (events at one instant keep their creation order)."""
        batch, url, index = KVEventBatch(ts=now_s, events=events), _url(replica), self.kv_index
        assert index is not None

        def deliver(_: float) -> None:
            index.apply_batch(url, batch)
        self.queue.push(Event(now_s + self.kv_events_delay_s, Phase.COMPLETION, deliver))

    def on_token(self, job: SimJob, now_s: float, first: bool) -> None:
        p = self.pending[job.index]
        if first or p.record.ttft_s is None:
            p.record.ttft_s = now_s - job.arrival_s
        elif p.last_token_s is not None:
            p.record.itl_s.append(now_s - p.last_token_s)
        p.last_token_s = now_s

    def on_tokens(self, job: SimJob, times_s: Sequence[float]) -> None:
        """A decode run's tokens after the first, with their times: one call for the whole run."""
        if len(times_s) == 0:
            return
        p = self.pending[job.index]
        if times_s is not self._gaps_of:  # every request of a run reports the same times: gaps once
            self._gaps_of = times_s
            self._gaps = array("d", map(operator.sub, times_s[1:], times_s))  # extends records by memcpy
        itl_s = p.record.itl_s
        if p.last_token_s is not None:
            itl_s.append(times_s[0] - p.last_token_s)
        itl_s.extend(self._gaps)
        p.last_token_s = times_s[-1]

    def on_finish(self, job: SimJob, now_s: float, prompt_tokens: int, cached_tokens: int,
                  completion_tokens: int) -> None:
        p = self.pending.pop(job.index)
        rec = p.record
        rec.e2e_s = now_s - job.arrival_s
        rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens = prompt_tokens, cached_tokens, completion_tokens
        if rec.ttft_s is None:
            rec.ttft_s = rec.e2e_s
        if completion_tokens > 1:
            rec.tpot_s = (rec.e2e_s - rec.ttft_s) / (completion_tokens - 1)
        rec.ok = True
        if p.predicted_cached_tokens is not None:
            self.prefix_predicted_tokens = (self.prefix_predicted_tokens or 0) + p.predicted_cached_tokens
            self.prefix_observed_tokens += cached_tokens
        ledger = self.ledgers[p.replica]
        ledger.in_flight -= 1
        ledger.in_flight_tokens -= p.tokens
        ledger.prefill_tokens += prompt_tokens - cached_tokens
        ledger.cached_tokens += cached_tokens
        self._stop_if_drained(p.replica, now_s)
        view = BackendView(index=p.replica, url=_url(p.replica), in_flight=ledger.in_flight,
                           prefill_tokens=ledger.prefill_tokens)
        info = RequestInfo(session_key=p.request.session_id, prompt_tokens=prompt_tokens)
        self.policy.on_request_complete(view, info, prompt_tokens, cached_tokens)

    def on_reject(self, job: SimJob, now_s: float, message: str) -> None:
        """The engine refused the request outright, as a live one answers 400: recorded failed."""
        p = self.pending.pop(job.index)
        p.record.error = f"HTTP 400: {message[:200]}"
        p.record.e2e_s = now_s - job.arrival_s
        ledger = self.ledgers[p.replica]
        ledger.in_flight -= 1
        ledger.in_flight_tokens -= p.tokens
        self._stop_if_drained(p.replica, now_s)

    # -- result ---------------------------------------------------------------------------

    def _result(self, label: str) -> RunResult:
        self.records.sort(key=lambda r: r.index)
        summary = summarize(self.records, self.slo)
        # a refused request has no latency to count
        e2e = [r.e2e_s for r in self.records if r.ok and r.e2e_s is not None]
        computed = sum(ledger.prefill_tokens for ledger in self.ledgers)
        reused = sum(ledger.cached_tokens for ledger in self.ledgers)
        meta = {
            "label": label, "source": "sim", "policy": self.policy.name, "replicas": self.num_replicas,
            "events": self.queue.events_run, "virtual_duration_s": self.queue.now_s,
            "e2e_mean_s": sum(e2e) / len(e2e) if e2e else None, "e2e_max_s": max(e2e, default=None),
            "prompt_tokens_computed": computed, "prompt_tokens_reused": reused,
            "hit_rate": reused / (computed + reused) if computed + reused else 0.0,
            # the policy's expected cache hits against the engines', over the requests it predicted
            "prefix_cached_tokens_predicted": self.prefix_predicted_tokens,
            "prefix_cached_tokens_observed": (None if self.prefix_predicted_tokens is None
                                              else self.prefix_observed_tokens),
            "prefill_tokens_per_replica": [ledger.prefill_tokens for ledger in self.ledgers],
            "requests_per_replica": [[r.index for r in self.records if r.backend == str(i)]
                                     for i in range(len(self.replicas))],
            "decisions_by_rule": dict(sorted(self.decisions.items())),
            "replicas_launched": len(self.replicas),
            "peak_ready_replicas": max(n for _, n in self.replica_counts),
        }
        meta.update(self._cost())
        if self.autoscaler:
            meta["autoscale"] = self.autoscaler.policy.name
            meta["scaling_decisions"] = dict(sorted(self.autoscaler.decisions.items()))
            meta["peak_waiting"] = max((s.waiting for s in self.autoscaler.history), default=0.0)
        return RunResult(summary=summary, requests=self.records, meta=meta, replicas=self.replica_counts)


    def _cost(self) -> dict[str, object]:
        """Replica- and GPU-seconds from each replica's launch until it stopped, or until the last
        request finished (the run's end: the fleet is not paid for past its workload)."""
        ends = [r.send_time_s + r.e2e_s for r in self.records if r.e2e_s is not None]
        end_s = max(ends, default=self.queue.now_s)
        spans = [Span(life.started_at_s, max(life.started_at_s, min(end_s, life.stopped_at_s or end_s)),
                      self.gpus_of(i)) for i, life in enumerate(self.lives)]
        events = self.autoscaler.scale_events if self.autoscaler else []
        return {**cost_meta(spans, events, len(self.lives) - self.num_replicas), "run_end_s": end_s}


class _LazyViews(Sequence[BackendView]):
    """The ready replicas' views, each built when a policy first reads it: reading a replica's
    metrics is pure, so the views are the same whenever built within one routing decision, and a
    policy that looks at one backend (round-robin) costs one view, not one per replica."""

    def __init__(self, fleet: FleetSim, ready: list[int], now_s: float) -> None:
        self._fleet, self._ready, self._now_s = fleet, ready, now_s
        self._built: dict[int, BackendView] = {}

    def __len__(self) -> int:
        return len(self._ready)

    @overload
    def __getitem__(self, position: int) -> BackendView: ...

    @overload
    def __getitem__(self, position: slice) -> list[BackendView]: ...

    def __getitem__(self, position: int | slice) -> BackendView | list[BackendView]:
        if isinstance(position, slice):
            return [self[i] for i in range(len(self._ready))[position]]
        position = range(len(self._ready))[position]  # negative indexes and bounds as a list's
        view = self._built.get(position)
        if view is None:
            view = self._built[position] = self._fleet._view(self._ready[position], self._now_s)
        return view
