"""The autoscaler loop: sample signals, ask the policy, start or drain replicas.

Every `sample_interval_s` it takes a signal sample; every `policy.interval_s` it builds the
FleetState, asks the policy and acts. New replicas enter the proxy's pool as starting, and the
proxy's health probes make them ready. A replica leaves in three steps: the pool stops routing
to it (draining), its in-flight requests finish (bounded by `drain_timeout_s`), then the actuator
stops it. A replica that is still loading is never drained: a decision naming one is held back
until the replica is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from policies.routing.base import BackendState
from policies.scaling.base import (
    FleetState,
    ReplicaInfo,
    ReplicaState,
    ScalingDecision,
    ScalingPolicy,
    ScalingSignals,
)
from policies.scaling.observe import record
from proxy.autoscale.actuator import Actuator, ActuatorError, ReplicaHandle
from proxy.autoscale.metrics import AutoscalerMetrics
from proxy.autoscale.signals import SERVING_STATES, SignalHistory
from proxy.config import BackendSpec
from proxy.pool import Backend, BackendPool

log = logging.getLogger(__name__)

DEFAULT_COLD_START_S = 60.0
"""Cold start assumed before one is measured, when the policy names none."""
COLD_STARTS_KEPT = 20
"""The measured cold start is the mean of this many newest launch-to-ready times."""


class SignalSource(Protocol):
    async def sample(self, at_s: float) -> ScalingSignals: ...


@dataclass
class ScaledClock:
    """The autoscaler's clock. `time_scale` has the look-alike engines' meaning: real seconds per
    modelled second, so 0.05 runs policies, windows and cooldowns 20 times faster."""

    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise ValueError(f"time_scale={self.time_scale!r}: must be > 0")
        self._origin = time.monotonic()

    def now_s(self) -> float:
        return (time.monotonic() - self._origin) / self.time_scale

    def real_s(self, seconds: float) -> float:
        """Real seconds that `seconds` of this clock take."""
        return seconds * self.time_scale


@dataclass
class ManagedReplica:
    """A replica the autoscaler started (or, for Kubernetes, found) and tracks."""

    handle: ReplicaHandle
    started_at_s: float
    """Launch time on the autoscaler's clock."""
    ready_at_s: float | None = None
    """First time the proxy found it ready; None while loading."""
    draining_since_s: float | None = None
    """When the loop stopped routing to it; None while it serves."""
    adopted: bool = False
    """Found running rather than launched (its launch time is unknown, so no cold start is measured)."""


@dataclass
class LoopSettings:
    """Timing of the loop; seconds are on the autoscaler's clock unless named real."""

    sample_interval_s: float | None = None
    """Seconds between signal samples; None: the policy's interval, at most 2 s."""
    drain_timeout_s: float = 300.0
    """Longest wait for a draining replica's in-flight requests before it is stopped anyway."""
    stop_grace_s: float = 30.0
    """Real seconds between the graceful stop of a drained replica and a forced one."""
    cold_start_s: float | None = None
    """Cold start assumed before one is measured; None: the policy's `cold_start_s`, else 60 s."""
    weight: float = 1.0
    """Capacity weight of the replicas it adds to the pool (`BackendSpec.weight`)."""
    recommend_only: bool = False
    """Decide and export the desired count, start and drain nothing (HPA or KEDA acts)."""


@dataclass
class Autoscaler:
    policy: ScalingPolicy
    actuator: Actuator
    pool: BackendPool
    source: SignalSource
    clock: ScaledClock = field(default_factory=ScaledClock)
    settings: LoopSettings = field(default_factory=LoopSettings)
    metrics: AutoscalerMetrics | None = None

    def __post_init__(self) -> None:
        self.replicas: dict[str, ManagedReplica] = {}
        self.history = SignalHistory()
        self.cold_starts_s: list[float] = []
        self.last_scaled_at_s: float | None = None
        self.next_decision_s = 0.0
        self.launched: list[ReplicaHandle] = []
        """Every replica started, oldest first."""
        self.decisions: list[ScalingDecision] = []
        """Every decision taken, oldest first (bounded), for logs and tests."""
        self._wake = asyncio.Event()
        self._from_zero = False
        self._observes = True
        """False once the actuator said it follows no replicas: a recommend-only fleet is then the pool."""
        self._drains: set[asyncio.Task] = set()

    @property
    def sample_interval_s(self) -> float:
        return self.settings.sample_interval_s or min(self.policy.interval_s, 2.0)

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except ActuatorError as exc:
                log.error("autoscaler: %s", exc)
            except Exception:  # one bad tick must not end scaling for the life of the proxy
                log.exception("autoscaler: tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.clock.real_s(self.sample_interval_s))
            self._wake.clear()

    def request_replica(self) -> None:
        """A request is waiting and no replica is ready or loading: start one at once."""
        if not self._from_zero and self.fleet_state(self.clock.now_s()).current == 0:
            self._from_zero = True
            self._wake.set()

    async def tick(self) -> None:
        now = self.clock.now_s()
        self.history.add(await self.source.sample(now))
        await self.reconcile(now)
        if self._from_zero:
            self._from_zero = False
            await self._scale_from_zero(now)
        if now >= self.next_decision_s:
            self.next_decision_s = now + self.policy.interval_s
            await self.decide(now)
        elif self.metrics is not None:
            fleet = self.fleet_state(now)
            self.metrics.set_replicas(replica_counts(fleet), fleet.cold_start_s)

    async def decide(self, now: float) -> ScalingDecision:
        fleet = self.fleet_state(now)
        decision = self.policy.decide(self.history.samples(), fleet)
        self.decisions = [*self.decisions[-999:], decision]
        if self.metrics is not None:
            self.metrics.observe(record(self.policy.name, fleet, decision))
        if decision.desired != fleet.current or decision.drain:
            log.info("autoscaler %s: %d -> %d (%s: %s)", self.policy.name, fleet.current, decision.desired,
                     decision.reason_label, decision.detail)
        await self.act(decision, fleet, now)
        return decision

    async def _scale_from_zero(self, now: float) -> None:
        if self.fleet_state(now).current == 0 and self.policy.limits.max_replicas > 0:
            if self.settings.recommend_only:  # HPA or KEDA starts it, on the metric
                if self.metrics is not None:
                    self.metrics.desired.set(1)
                return
            log.info("autoscaler: a request is waiting with no replica: starting one")
            await self.start_replicas(1, now)
            if self.metrics is not None:
                self.metrics.decisions.labels(self.policy.name, "scale-up").inc()
                self.metrics.desired.set(1)

    # --- the fleet as policies see it ---------------------------------------------------------

    def fleet_state(self, now: float) -> FleetState:
        if self.settings.recommend_only and not self._observes:
            infos = tuple(_pool_info(b) for b in self.pool if b.state is not BackendState.DRAINING)
        else:
            infos = tuple(self._info(rid, r) for rid, r in self.replicas.items())
        return FleetState(now_s=now, replicas=infos, cold_start_s=self.measured_cold_start_s,
                          last_scaled_at_s=self.last_scaled_at_s)

    def _info(self, replica_id: str, r: ManagedReplica) -> ReplicaInfo:
        backend = self.pool.find(r.handle.url) if r.handle.url else None
        if r.draining_since_s is not None:
            state = ReplicaState.DRAINING
        else:
            state = ReplicaState.READY if r.ready_at_s is not None else ReplicaState.STARTING
        return ReplicaInfo(replica_id, state, r.started_at_s, r.ready_at_s,
                           in_flight=backend.in_flight if backend else 0)

    @property
    def measured_cold_start_s(self) -> float | None:
        recent = self.cold_starts_s[-COLD_STARTS_KEPT:]
        return sum(recent) / len(recent) if recent else None

    def expected_cold_start_s(self) -> float:
        """The cold start to plan for: measured, else configured, else the policy's, else 60 s."""
        for value in (self.measured_cold_start_s, self.settings.cold_start_s,
                      getattr(self.policy.config, "cold_start_s", None)):
            if value is not None:
                return float(value)
        return DEFAULT_COLD_START_S

    def seconds_until_ready(self) -> float:
        """Autoscaler seconds until the first loading replica should serve (a full cold start
        when none is loading)."""
        now = self.clock.now_s()
        expected = self.expected_cold_start_s()
        loading = [r for r in self.replicas.values() if r.ready_at_s is None and r.draining_since_s is None]
        if not loading:
            return expected + self.sample_interval_s
        return max(0.0, min(expected - (now - r.started_at_s) for r in loading))

    # --- keeping the table in step with the pool and the actuator ----------------------------

    async def reconcile(self, now: float) -> None:
        await self._adopt_discovered(now)
        for replica_id in await self.actuator.exited():
            replica = self.replicas.pop(replica_id, None)
            if replica is not None and replica.handle.url:
                log.warning("autoscaler: replica %s exited on its own", replica_id)
                self.pool.drain(replica.handle.url)
                await self.actuator.stop_replica(replica_id, 0)
        for replica in self.replicas.values():
            if replica.ready_at_s is None and replica.handle.url and self._serving(replica.handle.url):
                replica.ready_at_s = now
                if not replica.adopted:
                    self.cold_starts_s = [*self.cold_starts_s[-COLD_STARTS_KEPT:], now - replica.started_at_s]

    def _serving(self, url: str) -> bool:
        backend = self.pool.find(url)
        return backend is not None and backend.state in SERVING_STATES

    async def _adopt_discovered(self, now: float) -> None:
        """Follow an actuator that learns its replicas from outside (Kubernetes EndpointSlices)."""
        found = await self.actuator.replicas()
        self._observes = found is not None
        if found is None:
            return
        ids = {h.replica_id for h in found}
        vanished = [rid for rid in self.replicas if rid not in ids]
        # A pod that appears takes over the launch time of a placeholder that just resolved.
        launches = sorted(self.replicas[rid].started_at_s for rid in vanished if self.replicas[rid].handle.url is None)
        for rid in vanished:
            gone = self.replicas.pop(rid)
            if gone.handle.url and gone.draining_since_s is None:
                self.pool.drain(gone.handle.url)
        for handle in found:
            if handle.replica_id not in self.replicas:
                self._track(handle, launches.pop(0) if launches else now, adopted=not launches)
            elif handle.url and self.replicas[handle.replica_id].handle.url != handle.url:
                self.replicas[handle.replica_id].handle = handle
                self.pool.add(BackendSpec(url=handle.url, flavor=self.actuator.flavor, weight=self.settings.weight),
                              source="autoscaler")

    def _track(self, handle: ReplicaHandle, started_at_s: float, adopted: bool = False) -> None:
        self.replicas[handle.replica_id] = ManagedReplica(handle, started_at_s, adopted=adopted)
        if handle.url:
            self.pool.add(BackendSpec(url=handle.url, flavor=self.actuator.flavor, weight=self.settings.weight),
                          source="autoscaler")

    # --- acting ------------------------------------------------------------------------------

    async def act(self, decision: ScalingDecision, fleet: FleetState, now: float) -> None:
        if self.settings.recommend_only:  # the decision is on /metrics; HPA or KEDA acts on it
            return
        if decision.desired > fleet.current:
            await self.start_replicas(decision.desired - fleet.current, now)
        for replica_id in decision.drain:
            self.begin_drain(replica_id, now)

    async def start_replicas(self, count: int, now: float) -> list[ReplicaHandle]:
        handles = []
        for _ in range(count):
            handle = await self.actuator.start_replica()
            self._track(handle, now)
            handles.append(handle)
            self.launched.append(handle)
        if handles:
            self.last_scaled_at_s = now
        return handles

    def begin_drain(self, replica_id: str, now: float) -> bool:
        """Stop routing to a ready replica and stop it once its requests finished; False for a
        replica that is loading, already draining or unknown."""
        replica = self.replicas.get(replica_id)
        if replica is None or replica.draining_since_s is not None:
            return False
        if replica.ready_at_s is None:
            log.info("autoscaler: not draining %s: it is still loading", replica_id)
            return False
        replica.draining_since_s = now
        self.last_scaled_at_s = now
        if replica.handle.url:
            self.pool.drain(replica.handle.url)
        task = asyncio.create_task(self._finish_drain(replica_id, replica))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)
        return True

    async def _finish_drain(self, replica_id: str, replica: ManagedReplica) -> None:
        assert replica.draining_since_s is not None  # set by the drain that started this task
        deadline = replica.draining_since_s + self.settings.drain_timeout_s
        while self._in_flight(replica) and self.clock.now_s() < deadline:
            await asyncio.sleep(min(0.05, self.clock.real_s(self.sample_interval_s)))
        if self._in_flight(replica):
            log.warning("autoscaler: %s still has requests after %.0f s of draining; stopping it",
                        replica_id, self.settings.drain_timeout_s)
        try:
            await self.actuator.stop_replica(replica_id, self.settings.stop_grace_s)
        finally:
            self.replicas.pop(replica_id, None)

    def _in_flight(self, replica: ManagedReplica) -> int:
        backend = self.pool.find(replica.handle.url) if replica.handle.url else None
        return backend.in_flight if backend is not None and backend.state is BackendState.DRAINING else 0

    async def shutdown(self) -> None:
        """Stop draining and stop every replica (the proxy is going away)."""
        for task in list(self._drains):
            task.cancel()
        await asyncio.gather(*self._drains, return_exceptions=True)
        await self.actuator.shutdown()
        self.replicas.clear()


def _pool_info(backend: Backend) -> ReplicaInfo:
    """A backend of the proxy's pool as a replica of a recommend-only fleet (launch time unknown)."""
    ready = backend.state in SERVING_STATES
    return ReplicaInfo(backend.url, ReplicaState.READY if ready else ReplicaState.STARTING, 0.0,
                       0.0 if ready else None, in_flight=backend.in_flight)


def replica_counts(fleet: FleetState) -> dict[str, int]:
    """state label -> replicas in that state."""
    return {s.value: len(fleet.in_state(s)) for s in ReplicaState}
