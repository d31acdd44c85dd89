"""Wiring the autoscaler into a proxy app: one `attach()` call after `build_app()`.

    app = build_app(proxy_config)
    autoscale_config = config_from_args(args)     # None: no autoscaler asked for
    if autoscale_config is not None:
        attach(app, autoscale_config)

`attach` adds the scale-from-zero middleware and an on_startup/on_cleanup pair: on startup it
builds the policy, the actuator and the signal source and starts the loop; on cleanup it stops
the loop and every replica the actuator started.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shlex
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from prometheus_client.registry import Collector

from policies.scaling import create_policy
from policies.scaling.base import ScalingPolicy
from proxy.app import PROXY_KEY
from proxy.autoscale.actuator import Actuator, ObserveNothing
from proxy.autoscale.config import AutoscaleConfig, HoldSettings
from proxy.autoscale.holder import Holder, hold_middleware
from proxy.autoscale.local import LocalActuator, guess_flavor
from proxy.autoscale.loop import Autoscaler, LoopSettings, ScaledClock, SignalSource
from proxy.autoscale.metrics import AutoscalerMetrics
from proxy.autoscale.signals import ArrivalCounter, PoolSignals, PrometheusSignals, parse_query_args
from proxy.pd import PrefillStage
from proxy.pool import BackendPool

AUTOSCALER_KEY: web.AppKey[AutoscaleRuntime] = web.AppKey("autoscaler")
PREFILL_AUTOSCALER_KEY: web.AppKey[AutoscaleRuntime] = web.AppKey("prefill_autoscaler")
"""P/D: the prefill pool's autoscaler (`role: prefill`), beside the decode pool's AUTOSCALER_KEY."""


def build_policy(config: AutoscaleConfig) -> ScalingPolicy:
    """The policy of the spec, with the config's replica bounds and interval laid over it."""
    defaults = {"interval_s": config.interval_s} if config.interval_s is not None else None
    policy = create_policy(config.policy, defaults)
    if config.interval_s is not None and hasattr(policy.config, "interval_s"):
        policy.config = dataclasses.replace(policy.config, interval_s=config.interval_s)  # type: ignore[type-var]
    bounds = {k: v for k, v in (("min_replicas", config.min_replicas), ("max_replicas", config.max_replicas))
              if v is not None}
    if bounds:
        policy.limits = dataclasses.replace(policy.limits, **bounds)
    return policy


def engine_flavor(config: AutoscaleConfig) -> str:
    if config.flavor is not None:
        return config.flavor
    guessed = guess_flavor(shlex.split(config.engine_cmd)) if config.engine_cmd else "openai"
    return guessed if guessed != "openai" else "vllm"


def build_actuator(config: AutoscaleConfig) -> Actuator:
    flavor = engine_flavor(config)
    if config.recommend_only and config.actuator != "kubernetes":
        return ObserveNothing()  # the loop sees the proxy's pool; the kubernetes actuator only watches pods
    if config.actuator == "local":
        assert config.engine_cmd  # AutoscaleConfig refuses the local actuator without one
        return LocalActuator(config.engine_cmd, flavor=flavor, log_dir=config.engine_log_dir)
    if config.actuator == "docker":
        from proxy.autoscale.docker import DockerActuator, DockerSettings

        command = tuple(shlex.split(config.engine_cmd)) if config.engine_cmd else ()
        return DockerActuator(DockerSettings(**{"command": command, **config.docker}), flavor)
    from proxy.autoscale.kubernetes import KubernetesActuator, KubernetesSettings

    return KubernetesActuator(KubernetesSettings(**config.kubernetes), flavor=flavor)


@dataclass
class AutoscaleRuntime:
    """The autoscaler's parts inside one proxy."""

    config: AutoscaleConfig
    policy: ScalingPolicy
    pool: BackendPool
    metrics: AutoscalerMetrics
    arrivals: ArrivalCounter
    holder: Holder
    autoscaler: Autoscaler | None = None
    session: aiohttp.ClientSession | None = None
    task: asyncio.Task | None = None
    ttft: Collector | None = None
    """What `start` reads TTFT from (set when attached)."""
    leader_only: bool = False
    """A worker of `flotilla proxy --workers N`: the loop starts only when this worker leads
    (proxy/workers.py), not with the app."""
    total_held: Callable[[], int] | None = None
    """The held requests the policy counts: this process's holder's unless set (several
    workers: all of theirs)."""

    def seconds_until_ready(self) -> float:
        """Real seconds until a replica should serve (Retry-After of held requests)."""
        if self.autoscaler is None:
            return 60.0
        return self.autoscaler.clock.real_s(self.autoscaler.seconds_until_ready())

    def request_replica(self) -> None:
        if self.autoscaler is not None:
            self.autoscaler.request_replica()

    async def start(self, ttft_histogram: Collector | None) -> None:
        self.session = aiohttp.ClientSession()
        held = self.total_held or (lambda: self.holder.held)  # read at sample time
        source: SignalSource
        if self.config.prometheus_url:
            source = PrometheusSignals(self.config.prometheus_url, self.session,
                                       parse_query_args(self.config.prometheus_queries), held=held)
        else:
            source = PoolSignals(self.pool, self.arrivals, ttft_histogram, held=held)
        settings = LoopSettings(sample_interval_s=self.config.sample_interval_s,
                                drain_timeout_s=self.config.drain_timeout_s, stop_grace_s=self.config.stop_grace_s,
                                weight=self.config.weight, recommend_only=self.config.recommend_only)
        self.autoscaler = Autoscaler(self.policy, build_actuator(self.config), self.pool, source,
                                     ScaledClock(self.config.time_scale), settings, self.metrics)
        self.task = asyncio.create_task(self.autoscaler.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        try:
            if self.autoscaler is not None:
                await self.autoscaler.shutdown()
        finally:
            if self.session is not None:
                await self.session.close()


def attach(app: web.Application, config: AutoscaleConfig, pool: BackendPool | None = None) -> AutoscaleRuntime:
    """Run the autoscaler inside the proxy `app` (call before the app starts). The policy spec
    is checked here, so a bad one fails before anything listens. `role: prefill` scales the P/D
    prefill pool (attach_prefill_pool), every other the proxy's ordinary pool."""
    if config.role == "prefill":
        return attach_prefill_pool(app, config, pool)
    proxy = app[PROXY_KEY]
    pool = pool if pool is not None else proxy.pool
    policy = build_policy(config)
    metrics = AutoscalerMetrics(proxy.metrics.registry, policy.name, config.pool_label)
    arrivals = ArrivalCounter()
    holder = Holder(pool, config.hold, on_reject=metrics.hold_rejections.inc)
    runtime = AutoscaleRuntime(config, policy, pool, metrics, arrivals, holder)
    # The holder asks the loop, which exists only once the app starts, through the runtime.
    holder.on_wait, holder.seconds_until_ready = runtime.request_replica, runtime.seconds_until_ready
    metrics.held.set_function(lambda: holder.held)

    def arrive() -> None:
        arrivals.arrive()
        metrics.arrivals.inc()

    app.middlewares.append(hold_middleware(runtime.holder, arrive, lambda: runtime.session))
    app[AUTOSCALER_KEY] = runtime
    _run_with(app, runtime, proxy.metrics.ttft_read())
    return runtime


def attach_prefill_pool(app: web.Application, config: AutoscaleConfig,
                        pool: BackendPool | None = None) -> AutoscaleRuntime:
    """Scale a P/D proxy's prefill pool (docs/pd.md): its own policy (pd-prefill reads waiting
    prompts and TTFT p90), signals from the prefill replicas' scrapes, and TTFT as the proxy's
    prefill phase (flotilla_pd_prefill_seconds). No request is held for it: with no prefill
    replica a request is prefilled on its decode replica. A proxy without prefill backends gets
    its prefill stage here, so the pool may start empty and grow."""
    proxy = app[PROXY_KEY]
    if proxy.prefill is None:
        proxy.prefill = PrefillStage(proxy.config, proxy.metrics, proxy.rng)
    stage = proxy.prefill
    pool = pool if pool is not None else stage.pool
    policy = build_policy(config)
    metrics = AutoscalerMetrics(proxy.metrics.registry, policy.name, config.pool_label)
    holder = Holder(pool, HoldSettings(max_requests=0))  # never consulted: no hold middleware
    runtime = AutoscaleRuntime(config, policy, pool, metrics, ArrivalCounter(), holder)
    app[PREFILL_AUTOSCALER_KEY] = runtime
    _run_with(app, runtime, stage.metrics.prefill_s)
    return runtime


def _run_with(app: web.Application, runtime: AutoscaleRuntime, ttft: Collector | None) -> None:
    """The runtime's loop lives as long as the app: started (reading `ttft`) on startup, stopped on cleanup."""

    runtime.ttft = ttft

    async def on_startup(_app: web.Application) -> None:
        if not runtime.leader_only:
            await runtime.start(ttft)

    async def on_cleanup(_app: web.Application) -> None:
        await runtime.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
