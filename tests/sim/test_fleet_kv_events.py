"""The simulator feeds a KV-index policy the engines' own KV events, in virtual time."""

from __future__ import annotations

import random

import pytest

from flotilla.kv_events import external_block_hash
from loadgen.synthetic import synthetic_requests
from policies.routing.base import RoutingPolicy
from policies.routing.kv_index import KVIndexUser
from policies.routing.registry import create_policy
from policies.routing.round_robin import RoundRobin
from sim.build import EngineSpec, engine_replicas, job_factory
from sim.fleet import FleetSim
from sim.replicas import CoreReplica

# 12 growing sessions over a shared system prompt: far more blocks than 2 x 120 hold
AGENTS = "agents:sessions=12,turns=5,system=256,growth=128/64,output=24,think=0.5,stagger=0.05"
SMALL_KV = EngineSpec(num_gpu_blocks_override=120, scheduler={"max_model_len": 1900})


class _RoundRobinWithIndex(KVIndexUser, RoundRobin):
    """Round-robin that declares a KV index (and never reads it): turns the engines' events on."""


def _fleet(policy: str | RoutingPolicy, delay_s: float = 0.005, replicas: int = 2) -> FleetSim:
    members = engine_replicas(SMALL_KV, replicas)
    chosen = create_policy(policy, rng=random.Random(0)) if isinstance(policy, str) else policy
    return FleetSim(make_replica=members.make_replica, num_replicas=replicas, policy=chosen,
                    make_job=job_factory(SMALL_KV), kv_events_delay_s=delay_s)


def _cores(sim: FleetSim) -> list[CoreReplica]:
    replicas = [r for r in sim.replicas if isinstance(r, CoreReplica)]
    assert len(replicas) == len(sim.replicas)
    return replicas


def test_after_a_workload_with_evictions_the_index_holds_exactly_what_each_engine_caches() -> None:
    sim = _fleet(_RoundRobinWithIndex())  # both replicas busy; the index does not depend on the policy
    sim.run(synthetic_requests(AGENTS))
    index = sim.kv_index
    assert index is not None
    for replica in _cores(sim):
        url = f"sim://{replica.index}"
        pool = replica.core.kv_cache_manager.block_pool  # type: ignore[attr-defined]
        cached = {external_block_hash(h) for h in pool.cached_block_hash_to_block}
        assert cached, "the engine cached nothing: the test proves nothing"
        assert index.stats(url).removed_blocks > 0, "no evictions: the KV cache is not small enough"
        assert index.engine_hashes(url) == cached
        assert index.size(url) == len(cached)


def test_every_engine_block_is_found_by_the_router_key_of_its_tokens() -> None:
    """The index's router keys, computed from tokens as the policy computes them for a request,
    find every request's cached prefix: what precise-prefix predicted is what the engines served."""
    sim = _fleet("precise-prefix")
    result = sim.run(synthetic_requests(AGENTS))
    assert result.meta["decisions_by_rule"].get("precise-match", 0) > 0
    assert result.meta["prefix_cached_tokens_predicted"] > 0


def test_events_reach_the_index_only_after_the_delay() -> None:
    """With events slower than the whole run, the policy never sees a cached block and routes
    every request by load; with no delay it finds prefixes."""
    late = _fleet("precise-prefix", delay_s=1e6).run(synthetic_requests(AGENTS))
    assert set(late.meta["decisions_by_rule"]) == {"least-load"}
    prompt = _fleet("precise-prefix", delay_s=0.0).run(synthetic_requests(AGENTS))
    assert prompt.meta["decisions_by_rule"].get("precise-match", 0) > 0


def test_events_are_off_and_decode_runs_on_for_a_policy_without_a_kv_index() -> None:
    sim = _fleet("prefix-aware")
    assert sim.kv_index is None
    for replica in _cores(sim):
        assert replica.kv_events is None and replica.runs
        assert not replica.core.config.enable_kv_cache_events  # type: ignore[attr-defined]


def test_with_events_on_decode_runs_are_off_and_the_engines_serve_the_same() -> None:
    """Events are dated by the step that made them, so each step is its own event; decode runs
    are exact, so a policy that does not read the index gets the same results either way."""
    plain, evented = _fleet("round-robin"), _fleet(_RoundRobinWithIndex())
    assert all(r.kv_events is not None and not r.runs for r in _cores(evented))
    a, b = plain.run(synthetic_requests(AGENTS)), evented.run(synthetic_requests(AGENTS))
    assert b.meta["decisions_by_rule"] == a.meta["decisions_by_rule"]
    assert [(r.backend, r.ttft_s, r.e2e_s, r.cached_tokens) for r in b.requests] == \
        [(r.backend, r.ttft_s, r.e2e_s, r.cached_tokens) for r in a.requests]
    assert a.meta["events"] < b.meta["events"]  # decode runs saved events in the plain run


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="kv_events_delay_s"):
        _fleet("precise-prefix", delay_s=-0.1)
