"""The loop's promises with real child processes and the real pool: a loading replica is never
drained, a draining replica is stopped only once its in-flight requests finished (or the drain
bound passed), replicas that die are dropped, and a decision starts what the policy asks for."""

from __future__ import annotations

import asyncio

from policies.routing.base import BackendState
from policies.scaling import create_policy
from policies.scaling.base import ReplicaState
from proxy.autoscale.local import LocalActuator
from proxy.autoscale.loop import Autoscaler, LoopSettings, ScaledClock
from proxy.autoscale.signals import ArrivalCounter, PoolSignals
from proxy.pool import BackendPool
from tests.proxy.autoscale.test_local import group_members, wait_members_gone
from tests.waiting import wait_until

SLEEPER = ["sh", "-c", "sleep 300", "sh"]


def scaler_for(policy: str, drain_timeout_s: float = 300.0, command=SLEEPER) -> Autoscaler:
    pool = BackendPool()
    return Autoscaler(create_policy(policy), LocalActuator(command), pool, PoolSignals(pool, ArrivalCounter()),
                      ScaledClock(0.01), LoopSettings(drain_timeout_s=drain_timeout_s, stop_grace_s=1.0))


def mark_ready(scaler: Autoscaler) -> None:
    """What the proxy's health probes do once an engine answers."""
    for backend in scaler.pool:
        backend.state, backend.ever_ready = BackendState.READY, True


async def test_the_first_decision_starts_min_replicas_as_starting_backends():
    scaler = scaler_for("seed:min_replicas=2")
    try:
        await scaler.tick()
        fleet = scaler.fleet_state(scaler.clock.now_s())
        assert (fleet.starting, fleet.ready) == (2, 0)
        assert [b.state for b in scaler.pool] == [BackendState.STARTING] * 2
        assert scaler.decisions[-1].reason_label == "min-replicas"
        mark_ready(scaler)
        await scaler.reconcile(scaler.clock.now_s())
        assert scaler.fleet_state(scaler.clock.now_s()).ready == 2
        assert scaler.measured_cold_start_s is not None and scaler.measured_cold_start_s >= 0
    finally:
        await scaler.shutdown()


async def test_the_replicas_it_starts_join_the_pool_with_the_configured_capacity_weight():
    pool = BackendPool()
    scaler = Autoscaler(create_policy("seed:min_replicas=1"), LocalActuator(SLEEPER), pool,
                        PoolSignals(pool, ArrivalCounter()), ScaledClock(0.01), LoopSettings(stop_grace_s=1.0, weight=3.5))
    try:
        await scaler.tick()
        assert [b.spec.weight for b in scaler.pool] == [3.5]
    finally:
        await scaler.shutdown()


async def test_a_loading_replica_is_never_drained():
    scaler = scaler_for("seed")
    try:
        (handle,) = await scaler.start_replicas(1, 0.0)
        assert scaler.begin_drain(handle.replica_id, 1.0) is False
        assert scaler.pool.find(handle.url).state is BackendState.STARTING
        await asyncio.sleep(0.2)  # nothing to wait for: the claim is that no stop comes, so give one time to
        assert group_members(handle.pid)
    finally:
        await scaler.shutdown()


async def test_a_draining_replica_stops_only_after_its_last_request():
    scaler = scaler_for("seed")
    try:
        (handle,) = await scaler.start_replicas(1, 0.0)
        mark_ready(scaler)
        await scaler.reconcile(0.0)
        backend = scaler.pool.find(handle.url)
        reservation = scaler.pool.reserve(backend, tokens=100)
        assert scaler.begin_drain(handle.replica_id, scaler.clock.now_s())
        assert backend.state is BackendState.DRAINING
        assert scaler.fleet_state(scaler.clock.now_s()).in_state(ReplicaState.DRAINING)[0].in_flight == 1
        assert scaler.pool.views(0.0) == []  # no new request goes there
        await asyncio.sleep(0.5)  # nothing to wait for: the claim is that no stop comes, so give one time to
        assert group_members(handle.pid), "stopped while a request was in flight"
        scaler.pool.release(reservation)
        assert await wait_members_gone(handle.pid) == []
        assert scaler.replicas == {} and len(scaler.pool) == 0
    finally:
        await scaler.shutdown()


async def test_a_drain_that_outlasts_its_bound_stops_the_replica_anyway():
    scaler = scaler_for("seed", drain_timeout_s=30.0)  # 0.3 s real at time scale 0.01
    try:
        (handle,) = await scaler.start_replicas(1, 0.0)
        mark_ready(scaler)
        await scaler.reconcile(0.0)
        scaler.pool.reserve(scaler.pool.find(handle.url), tokens=1)
        scaler.begin_drain(handle.replica_id, scaler.clock.now_s())
        assert await wait_members_gone(handle.pid) == []
    finally:
        await scaler.shutdown()


async def test_a_replica_that_dies_leaves_the_table_and_the_pool():
    scaler = scaler_for("seed:min_replicas=0", command=["sh", "-c", "exit 1", "sh"])
    try:
        (handle,) = await scaler.start_replicas(1, 0.0)

        async def gone() -> bool:
            await scaler.reconcile(scaler.clock.now_s())
            return not scaler.replicas

        await wait_until(gone, what="the dead replica out of the table")
        assert scaler.pool.find(handle.url) is None
    finally:
        await scaler.shutdown()


async def test_shutdown_stops_draining_and_leaves_no_process():
    scaler = scaler_for("seed")
    handles = await scaler.start_replicas(2, 0.0)
    mark_ready(scaler)
    await scaler.reconcile(0.0)
    scaler.pool.reserve(scaler.pool.find(handles[0].url), tokens=1)
    scaler.begin_drain(handles[0].replica_id, scaler.clock.now_s())
    await scaler.shutdown()
    for handle in handles:
        assert await wait_members_gone(handle.pid) == []
