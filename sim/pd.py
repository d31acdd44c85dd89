"""Disaggregated prefill/decode fleets under the virtual clock.

A request goes to a prefill replica chosen by the prefill pool's routing policy; the engine core
runs it with `max_tokens` 1 and holds its KV blocks (vLLM's NixlConnector, `do_remote_decode`).
The decode pool's policy then picks a decode replica; its core takes the request waiting for
remote KV (WAITING_FOR_REMOTE_KVS) and the replica pulls the prompt blocks its own prefix cache
lacks over its KV link: `fake_engines.perf.kv_transfer` sizes the pull (the same function the
look-alike engine uses), `sim.link.SharedLink` shares the link's bandwidth among concurrent pulls
into that replica (one NIC rail per GPU). When the pull ends the prefill side frees its blocks
(they stay in its prefix cache) and the decode core recomputes the last prompt token and
decodes. The client's record (TTFT from arrival: prefill queue and compute, transfer, the first
decode step) comes from the decode side.

Both pools are `FleetSim`s on one event queue, so each has its own policy, metric scrapes and,
optionally, its own autoscaler with its own scaling policy and signals.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fake_engines.core import VllmScheduler
from fake_engines.factory import VllmServeConfig, build_engine
from fake_engines.factory.catalogue import catalogue_of
from fake_engines.factory.vllm_engine import VllmEngineSpec, kv_dtype_bytes_of
from fake_engines.perf.kv_transfer import (
    DEFAULT_KV_LINK,
    KV_LINKS,
    blocks_to_pull,
    kv_block_bytes_per_gpu,
    kv_transfer,
)
from flotilla.fleet import EngineGroup, Fleet
from loadgen.cost import Span, cost_meta
from loadgen.results import RunResult, Slo
from loadgen.stats import summarize
from loadgen.trace import TraceRequest
from policies.routing.registry import create_policy
from policies.scaling import ScalingSignals
from sim.autoscale import SimAutoscaler
from sim.build import EngineSpec, engine_replica, fleet_replicas, job_factory, simulated_autoscaler
from sim.events import Event, Phase
from sim.fleet import FleetSim, Replica
from sim.link import SharedLink
from sim.replicas import CoreReplica, Listener, ReplicaMetrics, SimJob

Workload = Callable[[], Iterable[TraceRequest]]
DEFAULT_PREFILL_POLICY = "prefix-aware"
"""Prefill pool: the prompt's KV is computed there, so prefix reuse pays (vllm-router's PD default
pairs cache-aware prefill with load-aware decode)."""
DEFAULT_DECODE_POLICY = "least-load"
PulledHook = Callable[[SimJob, float], list[Event]]


@dataclass(frozen=True)
class PdFleet:
    """The shape of a P/D fleet: its pools, their policies and the KV link."""

    prefill_replicas: int
    decode_replicas: int
    prefill_policy: str = DEFAULT_PREFILL_POLICY
    decode_policy: str = DEFAULT_DECODE_POLICY
    kv_link: str = DEFAULT_KV_LINK
    """Catalogue link each decode replica pulls over (`--kv-link`)."""
    prefill_autoscale: str | None = None
    """Scaling policy of the prefill pool (None: fixed)."""
    decode_autoscale: str | None = None

    def __post_init__(self) -> None:
        if self.prefill_replicas < 1 or self.decode_replicas < 1:
            raise ValueError("a P/D fleet needs at least one prefill and one decode replica")
        if self.kv_link not in KV_LINKS:
            raise ValueError(f"kv link must be one of {', '.join(KV_LINKS)}, got {self.kv_link!r}")

    @property
    def label(self) -> str:
        return f"P/D {self.prefill_replicas}:{self.decode_replicas} {self.kv_link}"


@dataclass
class PullStats:
    """Every pull of a run: for meta.kv_transfer."""

    seconds: list[float] = field(default_factory=list)
    """Pull start (prefill finished) to KV loaded, per pulled request, contention included."""
    alone_s: list[float] = field(default_factory=list)
    """What each pull would have taken alone on its link (kv_transfer's figure)."""
    bytes_per_gpu: float = 0.0
    blocks: int = 0


class PullingReplica:
    """A decode replica: the real core, and a shared link its pulls flow over."""

    def __init__(self, inner: CoreReplica, link: SharedLink, block_bytes_per_gpu: float, block_size: int,
                 on_pulled: PulledHook, stats: PullStats) -> None:
        self.inner, self.link, self.on_pulled, self.stats = inner, link, on_pulled, stats
        self.index = inner.index
        self.cache_capacity_tokens = inner.cache_capacity_tokens
        self.kv_events = inner.kv_events
        self.block_bytes, self.block_size = block_bytes_per_gpu, block_size
        self.flowing: dict[Hashable, tuple[SimJob, float]] = {}
        self.generation = 0  # bumped whenever the flows change: older end events are stale

    def submit(self, job: SimJob, now_s: float) -> list[Event]:
        events = self.inner.submit(job, now_s)
        core = _vllm_core(self.inner)
        request = core.requests.get(str(job.index))
        if request is None:  # refused (400): nothing to pull
            return events
        hits = core.num_local_hit_tokens(request)
        transfer = kv_transfer(blocks_to_pull(request.num_prompt_tokens, hits, self.block_size),
                               self.block_bytes, self.link.link)
        self.stats.alone_s.append(transfer.seconds)
        self.stats.bytes_per_gpu += transfer.bytes_per_gpu
        self.stats.blocks += transfer.num_blocks
        if transfer.num_blocks == 0:
            return events + self._pulled(job, now_s)
        start = functools.partial(self._flow, job, transfer.bytes_per_gpu, now_s)
        return events + [Event(now_s + self.link.link.latency_s, Phase.COMPLETION, start)]

    def _flow(self, job: SimJob, num_bytes: float, asked_s: float, now_s: float) -> list[Event]:
        self.flowing[job.index] = (job, asked_s)
        self.link.add(job.index, num_bytes, now_s)
        return self._next_end(now_s)

    def _next_end(self, now_s: float) -> list[Event]:
        self.generation += 1
        end_s = self.link.next_done_s()
        if end_s is None:
            return []
        return [Event(max(end_s, now_s), Phase.COMPLETION, functools.partial(self._ended, self.generation))]

    def _ended(self, generation: int, now_s: float) -> list[Event]:
        if generation != self.generation:
            return []
        events: list[Event] = []
        for key in self.link.take_done(now_s):
            job, _ = self.flowing.pop(key)
            events += self._pulled(job, now_s)
        return events + self._next_end(now_s)

    def _pulled(self, job: SimJob, now_s: float) -> list[Event]:
        rid = str(job.index)
        core = _vllm_core(self.inner)
        events = self.inner.wake(now_s, lambda: core.finish_remote_kv_load(rid))
        return events + self.on_pulled(job, now_s)

    def metrics(self) -> ReplicaMetrics:
        return self.inner.metrics()


@dataclass
class PoolAutoscaler(SimAutoscaler):
    """A pool's autoscaler: the fleet's signals plus the pool's own latency over the interval
    (prefill: its TTFT, arrival to prefill done; decode: the clients' TPOT), as a p90."""

    latency_signal: str = "ttft_p90_s"
    finished: list[float] = field(default_factory=list)
    """Latencies of the requests the pool finished since the last decision."""

    def sample(self, now_s: float, metrics: Sequence[ReplicaMetrics], held: int) -> ScalingSignals:
        base = super().sample(now_s, metrics, held)
        values, self.finished = sorted(self.finished), []
        if not values:
            return base
        return dataclasses.replace(base, **{self.latency_signal: values[min(len(values) - 1, int(0.9 * len(values)))]})


def _pool_autoscaler(scaler: SimAutoscaler | None, latency_signal: str) -> PoolAutoscaler | None:
    if scaler is None:
        return None
    return PoolAutoscaler(policy=scaler.policy, cold_start_s=scaler.cold_start_s, capacity_rps=scaler.capacity_rps,
                          latency_signal=latency_signal)


def _vllm_core(replica: CoreReplica) -> VllmScheduler:
    """A P/D replica's core: a vLLM one (PdSim builds only those)."""
    core = replica.core
    assert isinstance(core, VllmScheduler)
    return core


class _PrefillPool(FleetSim):
    """The prefill pool: its first token goes back to the router, not to the client."""

    handoff: Callable[[TraceRequest, int, int, float], None] = lambda req, index, replica, now_s: None

    def on_token(self, job: SimJob, now_s: float, first: bool) -> None:
        pass

    def on_tokens(self, job: SimJob, times_s: Any) -> None:
        pass

    def on_finish(self, job: SimJob, now_s: float, prompt_tokens: int, cached_tokens: int,
                  completion_tokens: int) -> None:
        p = self.pending[job.index]
        super().on_finish(job, now_s, prompt_tokens, cached_tokens, completion_tokens)
        if isinstance(self.autoscaler, PoolAutoscaler):
            self.autoscaler.finished.append(now_s - job.arrival_s)
        self.handoff(p.request, job.index, p.replica, now_s)


class _DecodePool(FleetSim):
    """The decode pool: requests come from the prefill pool, not from the trace."""

    upstream: FleetSim | None = None

    def on_finish(self, job: SimJob, now_s: float, prompt_tokens: int, cached_tokens: int,
                  completion_tokens: int) -> None:
        record = self.pending[job.index].record
        super().on_finish(job, now_s, prompt_tokens, cached_tokens, completion_tokens)
        if isinstance(self.autoscaler, PoolAutoscaler) and record.tpot_s is not None:
            self.autoscaler.finished.append(record.tpot_s)

    def _finished(self) -> bool:
        return (self.upstream is not None and self.upstream._finished()) and not self.pending and not self.held


class PdSim:
    """One run of a workload through a P/D fleet."""

    def __init__(self, spec: EngineSpec, fleet: PdFleet, seed: int = 0, slo: Slo | None = None,
                 scrape_interval_s: float | None = None, cold_start: float | None = None,
                 groups: tuple[EngineGroup, EngineGroup] | None = None) -> None:
        """`groups`: the (prefill, decode) engine groups of a fleet file; default: `spec`'s engine
        for both pools, `fleet`'s replica counts."""
        if groups is None:
            if spec.kind != "vllm":
                raise ValueError("a P/D fleet is a vLLM fleet (the NIXL connector): use --engine vllm")
            groups = (spec.group(fleet.prefill_replicas, seed), spec.group(fleet.decode_replicas, seed))
        self.spec, self.fleet, self.slo, self.groups = spec, fleet, slo, groups
        engine = build_engine(groups[1].engine_config())  # the decode side pulls: its layout's bytes
        config, sized = engine.config, engine.spec
        if not isinstance(config, VllmServeConfig) or not isinstance(sized, VllmEngineSpec):
            raise ValueError("a P/D fleet is a vLLM fleet (the NIXL connector): its groups need flavor vllm")
        link = catalogue_of(config.catalogue).link(fleet.kv_link)
        block = config.resolved_block_size
        block_bytes = kv_block_bytes_per_gpu(sized.model, sized.layout, kv_dtype_bytes_of(config), block)
        self.stats = PullStats()
        self.pulled_from: dict[int, tuple[int, float]] = {}  # request -> (prefill replica, pull asked at)
        self.links: list[SharedLink] = []
        members_p, members_d = (dataclasses.replace(fleet_replicas(Fleet(engines=(g,))), fleet=None) for g in groups)
        jobs = job_factory()

        def prefill_job(req: TraceRequest, index: int) -> SimJob:
            job = jobs(req, index)
            job.output_len, job.kv_transfer_hold = 1, True  # the proxy sends max_tokens 1
            return job

        def decode_job(req: TraceRequest, index: int) -> SimJob:
            job = jobs(req, index)
            job.remote_prefill = True
            return job

        def make_decode(index: int, listener: Listener) -> Replica:
            shared = SharedLink(link)
            self.links.append(shared)
            return PullingReplica(engine_replica(engine, index, listener), shared, block_bytes, block,
                                  self._pulled, self.stats)

        def scaler(policy: str | None, members, latency_signal: str):  # type: ignore[no-untyped-def]
            built = simulated_autoscaler(members, policy, cold_start, spec) if policy else None
            return _pool_autoscaler(built, latency_signal)

        self.prefill = _PrefillPool(
            make_replica=members_p.make_replica, num_replicas=members_p.count,
            policy=create_policy(fleet.prefill_policy, rng=random.Random(seed)), make_job=prefill_job,
            scrape_interval_s=scrape_interval_s, autoscaler=scaler(fleet.prefill_autoscale, members_p, "ttft_p90_s"),
            gpus_of=members_p.gpus)
        self.decode = _DecodePool(
            make_replica=make_decode, num_replicas=members_d.count,
            policy=create_policy(fleet.decode_policy, rng=random.Random(seed + 1)), make_job=decode_job,
            scrape_interval_s=scrape_interval_s, autoscaler=scaler(fleet.decode_autoscale, members_d, "tpot_p90_s"),
            gpus_of=members_d.gpus, queue=self.prefill.queue)
        self.decode.upstream = self.prefill
        self.prefill.handoff = self._handoff

    def _handoff(self, req: TraceRequest, index: int, prefill_replica: int, now_s: float) -> None:
        """The prefill finished: the router sends the request, with its kv_transfer_params, to decode."""
        self.pulled_from[index] = (prefill_replica, now_s)
        decode = self.decode
        if decode.autoscaler:
            decode.autoscaler.arrived(req.input_length or 0, req.output_length)
        if not decode._ready():
            decode.held.append((index, req))
            return
        decode.queue.extend(decode._dispatch(index, req, now_s))

    def _pulled(self, job: SimJob, now_s: float) -> list[Event]:
        """The decode side has the KV: the prefill side frees the blocks it held (its read notification)."""
        prefill_replica, asked_s = self.pulled_from.pop(job.index)
        self.stats.seconds.append(now_s - asked_s)
        replica = self.prefill.replicas[prefill_replica]
        assert isinstance(replica, CoreReplica)
        core = _vllm_core(replica)
        return replica.wake(now_s, lambda: core.release_transfer_hold(str(job.index)))

    def run(self, workload: Iterable[TraceRequest], label: str | None = None) -> RunResult:
        queue = self.decode.queue
        for pool in (self.decode,):  # the prefill pool's own run() schedules its own
            if pool.scrape_interval_s:
                queue.push(Event(0.0, Phase.SCRAPE, pool._scrape))
            if pool.autoscaler:
                queue.push(Event(pool.autoscaler.policy.interval_s, Phase.SCALE, pool._scale))
        prefill_result = self.prefill.run(workload, label="prefill")
        return self._result(label or self.fleet.label, prefill_result)

    def _result(self, label: str, prefill_result: RunResult) -> RunResult:
        decoded = {r.index for r in self.decode.records}
        failed = [r for r in self.prefill.records if r.index not in decoded]  # refused at prefill
        self.decode.records.extend(failed)
        result = self.decode._result(label)
        records = result.requests
        ends = [r.send_time_s + r.e2e_s for r in records if r.e2e_s is not None]
        end_s = max(ends, default=self.decode.queue.now_s)
        spans = [Span(life.started_at_s, max(life.started_at_s, min(end_s, life.stopped_at_s or end_s)),
                      pool.gpus_of(i))
                 for pool in (self.prefill, self.decode) for i, life in enumerate(pool.lives)]
        events = [e for pool in (self.prefill, self.decode) if pool.autoscaler for e in pool.autoscaler.scale_events]
        cold = sum(len(pool.lives) - pool.num_replicas for pool in (self.prefill, self.decode))
        meta = result.meta
        meta.update(cost_meta(spans, sorted(events, key=lambda e: e.at_s), cold))
        meta.update(self._pd_meta(prefill_result, end_s))
        return dataclasses.replace(result, summary=summarize(records, self.slo), meta=meta)

    def _pd_meta(self, prefill_result: RunResult, end_s: float) -> dict[str, Any]:
        fleet, (prefill, decode) = self.fleet, self.groups
        pulls = sorted(self.stats.seconds)
        return {
            "run_end_s": end_s, "engine": "vllm", "model": decode.model, "gpu": decode.gpu,
            "pd": {"prefill_replicas": fleet.prefill_replicas, "decode_replicas": fleet.decode_replicas,
                   "prefill_policy": fleet.prefill_policy, "decode_policy": fleet.decode_policy,
                   "kv_link": fleet.kv_link, "prefill_autoscale": fleet.prefill_autoscale,
                   "decode_autoscale": fleet.decode_autoscale,
                   "prefill_ttft_p50_s": prefill_result.summary.ttft_s.p50,
                   "prefill_peak_replicas": prefill_result.meta.get("peak_ready_replicas"),
                   "decode_peak_replicas": max(n for _, n in self.decode.replica_counts),
                   "prefill_scale_events": _steps(self.prefill), "decode_scale_events": _steps(self.decode)},
            "gpus": sum(g.replicas * g.tensor_parallel * g.pipeline_parallel for g in (prefill, decode)),
            "kv_transfer": {"pulls": len(pulls), "blocks": self.stats.blocks,
                            "bytes_per_gpu": self.stats.bytes_per_gpu,
                            "mean_s": sum(pulls) / len(pulls) if pulls else None,
                            "p99_s": pulls[min(len(pulls) - 1, int(0.99 * len(pulls)))] if pulls else None,
                            "alone_mean_s": (sum(self.stats.alone_s) / len(self.stats.alone_s)
                                             if self.stats.alone_s else None),
                            "peak_concurrent": max((link.peak_flows for link in self.links), default=0)},
        }


def _steps(pool: FleetSim) -> list[tuple[float, int]]:
    """A pool's scale events as (virtual time, replicas after)."""
    return [(e.at_s, e.to_replicas) for e in (pool.autoscaler.scale_events if pool.autoscaler else ())]


def simulate_pd(workload: Workload, spec: EngineSpec, fleet: PdFleet, seed: int = 0, slo: Slo | None = None,
                scrape_interval_s: float | None = None, cold_start: float | None = None) -> RunResult:
    """One P/D run; `workload()` is called afresh, so a colocated run sees the same arrivals."""
    return PdSim(spec, fleet, seed, slo, scrape_interval_s, cold_start).run(workload())


def compare_pd(workload: Workload, spec: EngineSpec,
               fleets: Iterable[PdFleet | tuple[tuple[EngineGroup, EngineGroup], PdFleet]], colocated_replicas: int | None,
               colocated_policy: str = DEFAULT_DECODE_POLICY, seed: int = 0, slo: Slo | None = None,
               scrape_interval_s: float | None = None) -> list[RunResult]:
    """The colocated fleet (`colocated_replicas` of `spec`, None: none) and every P/D fleet (of
    `spec`, or a fleet file's groups), on identical arrivals."""
    from sim.run import simulate

    results = []
    if colocated_replicas:
        base = simulate(workload, spec, colocated_replicas, colocated_policy, seed, scrape_interval_s, slo)
        base.meta.update(label=f"colocated x{colocated_replicas}",
                         gpus=colocated_replicas * spec.layout.tp * spec.layout.pp)
        results.append(dataclasses.replace(base, meta=base.meta))
    for fleet in fleets:
        if isinstance(fleet, tuple):  # a fleet file's (prefill, decode) groups and its P/D fleet
            groups, pd = fleet
            sim = PdSim(spec, pd, seed, slo, scrape_interval_s, groups=groups)
        else:
            sim = PdSim(spec, fleet, seed, slo, scrape_interval_s)
        results.append(sim.run(workload()))
    return results


def check_splits(spec: EngineSpec, splits: Iterable[tuple[int, int]], colocated_replicas: int, kv_link: str,
                 rate_rps: float, input_len: int, output_len: int, slo: Slo, requests: int = 300,
                 seed: int = 0) -> list[RunResult]:
    """`flotilla plan pd`'s check: the colocated fleet and each (prefill, decode) split, on the same
    Poisson arrivals of `requests` requests of the planned shape at `rate_rps`."""
    from loadgen.synthetic import synthetic_requests

    duration = requests / rate_rps
    workload_spec = f"poisson:rate={rate_rps:.6g},duration={duration:.6g},input={input_len},output={output_len}"

    def workload() -> list[TraceRequest]:
        return list(synthetic_requests(workload_spec, seed=seed))

    fleets = [PdFleet(p, d, kv_link=kv_link) for p, d in splits]
    return compare_pd(workload, spec, fleets, colocated_replicas, seed=seed, slo=slo)


def fleet_file_pd(fleet: Fleet, prefill_policy: str | None = None, decode_policy: str | None = None,
                  kv_links: Sequence[str] = ()) -> list[tuple[tuple[EngineGroup, EngineGroup], PdFleet]]:
    """The P/D fleets of a fleet file's `role: prefill` and `role: decode` groups (one of each),
    per KV link (default: the decode group's `--kv-link`); empty when the file has no roles."""
    prefill = [g for g in fleet.engines if g.role == "prefill"]
    decode = [g for g in fleet.engines if g.role == "decode"]
    if not prefill and not decode:
        return []
    if len(prefill) != 1 or len(decode) != 1 or len(fleet.engines) != 2:
        raise ValueError("a simulated P/D fleet file has one role: prefill group and one role: decode group")
    groups = (prefill[0], decode[0])
    links = list(kv_links) or [build_engine(decode[0].engine_config()).config.kv_link]  # type: ignore[union-attr]
    return [(groups, PdFleet(prefill[0].replicas, decode[0].replicas, prefill_policy or DEFAULT_PREFILL_POLICY,
                             decode_policy or DEFAULT_DECODE_POLICY, link)) for link in links]
