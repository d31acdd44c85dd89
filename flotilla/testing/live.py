"""A live fleet in this process: look-alike engines and the proxy on free 127.0.0.1 ports.

Engines run `time_scale` times faster than modelled time. `replay` sends the workload through
the proxy with the open-loop runner at speedup 1 / time_scale and converts the client's wall
times back to modelled seconds, so its result reads like the simulator's (a few milliseconds of
loop and socket latency, divided by the time scale, are the difference).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from flotilla.fleet import EngineGroup, Fleet
from flotilla.testing.simulated import fleet_meta
from flotilla.testing.spec import FleetSpec, FleetSpecError
from flotilla.testing.workload import ReplayOptions, Workload, load_workload
from loadgen.results import RequestRecord, RunResult, Slo
from loadgen.runner import OpenLoopRunner, RunnerConfig
from loadgen.stats import summarize
from loadgen.timebase import scaled_record

LIVE_SCRAPE_WALL_S = 0.05
"""Proxy scrape interval in wall seconds when the spec sets none."""
HEALTH_INTERVAL_WALL_S = 0.5
"""Proxy health-probe interval in wall seconds."""


@dataclass
class LiveFleet:
    """Running engines and the proxy in front of them; `close()` stops them all."""

    fleet: Fleet
    """The fleet model it runs: every group's `replicas`, no autoscaler."""
    spec: FleetSpec | None = None
    """The keywords it was built from; None for a fleet file's fleet."""
    engines: list[Any] = field(default_factory=list)
    """RunningVllm or RunningLlama servers, in backend order."""
    proxy: Any = None
    """The RunningProxy."""
    source: str = "live"
    """Where results come from: `live` here, `sim` for `SimFleet`."""

    @classmethod
    async def start(cls, spec: FleetSpec | Fleet) -> LiveFleet:
        """Start every engine (no cold start) in the order `flotilla up`'s proxy lists them, wait
        until they serve, then the proxy."""
        fleet = cls(spec if isinstance(spec, Fleet) else spec.fleet(), spec if isinstance(spec, FleetSpec) else None)
        if len({g.time_scale for g in fleet.fleet.engines}) > 1:
            raise FleetSpecError("time_scale", [g.time_scale for g in fleet.fleet.engines],
                                 "a live fleet runs its engine groups at one time scale")
        try:
            for group in fleet.fleet.started():
                fleet.engines.append(await _start_engine(group))
            await asyncio.gather(*(e.wait_ready() for e in fleet.engines))
            fleet.proxy = await _start_proxy(fleet.fleet, fleet.engine_urls)
        except BaseException:
            await fleet.close()
            raise
        return fleet

    @property
    def time_scale(self) -> float:
        """Wall seconds per modelled second of every engine."""
        return self.fleet.time_scale

    @property
    def url(self) -> str:
        """The proxy's base URL (what clients talk to)."""
        return str(self.proxy.url)

    @property
    def engine_urls(self) -> list[str]:
        """Each engine's base URL; position i is backend `str(i)` in results."""
        return [f"http://127.0.0.1:{e.port}" for e in self.engines]

    async def replay(self, workload: Workload, **options: Any) -> RunResult:
        """Replay `workload` through the proxy; latencies in modelled seconds, backends by index."""
        opts = ReplayOptions.from_kwargs(**options)
        requests = load_workload(workload, opts)
        label = opts.label or self.fleet.policy
        cfg = RunnerConfig(target_url=self.url, model=self.fleet.engines[0].served_model, speedup=1 / self.time_scale,
                           endpoint=opts.endpoint, request_timeout_s=opts.request_timeout_s,
                           show_progress=False)
        wall = await OpenLoopRunner(cfg).run(requests)
        index = {url: str(i) for i, url in enumerate(self.engine_urls)}
        records = [to_modelled(r, self.time_scale, index) for r in wall.requests]
        slo = opts.slo if isinstance(opts.slo, Slo) else self.fleet.slo
        meta = {**fleet_meta(self.fleet, "live", label), "time_scale": self.time_scale, "target": self.url,
                "e2e_max_s": max((r.e2e_s for r in records if r.e2e_s is not None), default=None),
                "engines": [_describe(g, e) for g, e in zip(self.fleet.started(), self.engines, strict=True)]}
        return RunResult(summary=summarize(records, slo), requests=records, meta=meta,
                         replicas=[(0.0, len(self.engines))])

    async def close(self) -> None:
        """Stop the proxy, then the engines; safe to call twice."""
        proxy, engines = self.proxy, self.engines
        self.proxy, self.engines = None, []
        if proxy is not None:
            await proxy.close()
        for engine in engines:
            with contextlib.suppress(Exception):
                await engine.close()


def to_modelled(rec: RequestRecord, time_scale: float, backend_index: dict[str, str]) -> RequestRecord:
    """A client record with wall seconds turned into modelled seconds and the backend URL into its index."""
    return dataclasses.replace(scaled_record(rec, time_scale), backend=backend_index.get(rec.backend or "", rec.backend))


async def _start_engine(group: EngineGroup) -> Any:
    """One replica of `group`, from the config its command line gives (the engine factory reads
    it), listening on a free port."""
    config = group.engine_config(port=0)
    if group.flavor == "vllm":
        from fake_engines.vllm.server import start_vllm

        return await start_vllm(config, cold_start=False)  # type: ignore[arg-type]
    from fake_engines.llamacpp.server import start_llama

    return await start_llama(config, cold_start=False)  # type: ignore[arg-type]


def _describe(group: EngineGroup, engine: Any) -> dict[str, Any]:
    """A running engine as `meta.engines` lists it, from the config it runs with (the simulator
    lists its replicas alike)."""
    from fake_engines.factory import build_engine

    return {"group": group.name, "flavor": group.flavor, "config": build_engine(engine.server.config).describe()}


async def _start_proxy(fleet: Fleet, urls: list[str]) -> Any:
    import random

    from proxy.app import start_proxy
    from proxy.config import BackendSpec, HealthConfig, ProxyConfig

    scrape_s = fleet.scrape_interval_s * fleet.time_scale if fleet.scrape_interval_s else LIVE_SCRAPE_WALL_S
    backends = [BackendSpec(url=u, flavor=g.flavor, models=(g.served_model,), weight=g.capacity_weight(),
                            kv_events=g.kv_events())
                for u, g in zip(urls, fleet.started(), strict=True)]
    config = ProxyConfig(port=0, policy=fleet.policy, scrape_interval_s=scrape_s,
                         health=HealthConfig(interval_s=HEALTH_INTERVAL_WALL_S), backends=backends)
    return await start_proxy(config, rng=random.Random(fleet.seed))
