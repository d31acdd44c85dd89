"""Decode runs in the simulator: one event per stretch of identical decode steps changes nothing
anyone can observe, against the same fleet stepped one event per engine step."""

from __future__ import annotations

import random

import pytest

from loadgen.trace import TraceRequest
from policies.routing.registry import create_policy
from sim.build import EngineSpec, job_factory, replica_factory
from sim.fleet import FleetSim
from sim.replicas import CoreReplica


def _workload(n: int, seed: int = 3) -> list[TraceRequest]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(12.0)
        out.append(TraceRequest(timestamp_s=round(t, 6), input_length=rng.randint(20, 900),
                                output_length=rng.randint(1, 300), session_id=f"s{i % 7}",
                                hash_ids=(i % 5, 100 + i % 3), block_tokens=64))
    return out


def _run(decode_runs: bool, policy: str, blocks: int | None, scrape_s: float | None,
         llamacpp: dict | None = None) -> tuple:
    # max_model_len auto: what the small caches hold (vLLM refuses a default 128K context there)
    spec = EngineSpec(kind="vllm", scheduler={"block_size": 16, "max_num_seqs": 12, "max_model_len": -1},
                      num_gpu_blocks_override=blocks)
    if llamacpp is not None:
        spec = EngineSpec(kind="llamacpp", gpu="rtx4090", scheduler=llamacpp)
    factory = replica_factory(spec)

    def make(index: int, listener: object) -> CoreReplica:
        replica = factory(index, listener)
        replica.runs = replica.runs and decode_runs
        return replica

    sim = FleetSim(make_replica=make, num_replicas=3, policy=create_policy(policy, rng=random.Random(0)),
                   make_job=job_factory(spec), scrape_interval_s=scrape_s)
    result = sim.run(_workload(240), label=policy)
    stats = [r.core.stats() for r in sim.replicas]
    records = [(r.index, r.backend, r.ttft_s, r.e2e_s, r.itl_s, r.cached_tokens) for r in result.requests]
    return records, stats, sim.queue.events_run


@pytest.mark.parametrize(("policy", "blocks", "scrape_s"), [
    ("round-robin", None, None),
    ("least-load", 200, None),  # a small cache: preemptions, and runs cut short by free blocks
    ("least-load:signal=kv_cache_usage", 300, None),  # KV usage read mid-run at every arrival
    ("least-load:signal=kv_cache_usage", 300, 0.25),
])
def test_decode_runs_reproduce_step_by_step_records_and_counters(policy: str, blocks: int | None,
                                                                 scrape_s: float | None) -> None:
    fast_records, fast_stats, fast_events = _run(True, policy, blocks, scrape_s)
    slow_records, slow_stats, slow_events = _run(False, policy, blocks, scrape_s)
    assert fast_records == slow_records
    assert fast_stats == slow_stats
    assert fast_events < slow_events
    if blocks == 200:
        assert sum(s.num_preemptions for s in slow_stats) > 0



@pytest.mark.parametrize(("policy", "flags", "scrape_s"), [
    ("round-robin", {"n_parallel": 4}, None),  # 1,024-token slots: some requests stop at the slot's context
    ("least-load", {"n_ctx": 2048}, None),  # one 2,048-cell pool for 4 slots: idle caches dropped, out of cells
    ("least-load:signal=kv_cache_usage", {"n_ctx": 8192, "slot_prompt_similarity": 0.5}, 0.25),
])
def test_llamacpp_decode_runs_reproduce_step_by_step_records_slots_and_counters(
        policy: str, flags: dict, scrape_s: float | None) -> None:
    fast_records, fast_stats, fast_events = _run(True, policy, None, scrape_s, llamacpp=flags)
    slow_records, slow_stats, slow_events = _run(False, policy, None, scrape_s, llamacpp=flags)
    assert fast_records == slow_records
    assert fast_stats == slow_stats  # slot states included: caches, last use, task ids
    assert fast_events < slow_events

def test_the_builtin_block_hash_gives_the_same_run_as_the_engines_sha256_default() -> None:
    # the simulator keys blocks as the engine does (sha256) unless told builtin, which is faster;
    # hits, evictions and preemptions must not move
    def run(algo: str | None) -> tuple:
        flags = {"block_size": 16, "max_num_seqs": 12, "max_model_len": -1}
        flags |= {"prefix_caching_hash_algo": algo} if algo else {}
        spec = EngineSpec(kind="vllm", scheduler=flags, num_gpu_blocks_override=200)
        sim = FleetSim(make_replica=replica_factory(spec), num_replicas=3, make_job=job_factory(spec),
                       policy=create_policy("prefix-aware", rng=random.Random(0)))
        result = sim.run(_workload(240), label=algo or "default")
        assert {r.core.config.prefix_caching_hash_algo for r in sim.replicas} == {algo or "sha256"}
        return ([(r.index, r.backend, r.ttft_s, r.e2e_s, r.cached_tokens) for r in result.requests],
                [r.core.stats() for r in sim.replicas])

    default, builtin = run(None), run("builtin")
    assert default == builtin
    assert sum(r[4] for r in default[0]) > 0 and sum(s.num_preemptions for s in default[1]) > 0


def test_a_request_the_engine_refuses_fails_with_a_400_and_the_others_run_on_unchanged() -> None:
    def run(workload: list[TraceRequest]) -> tuple:
        spec = EngineSpec(kind="vllm", scheduler={"block_size": 16, "max_model_len": 2048})
        sim = FleetSim(make_replica=replica_factory(spec), num_replicas=2, make_job=job_factory(spec),
                       policy=create_policy("least-load", rng=random.Random(0)))
        result = sim.run(workload, label="reject")
        return result, sim

    base = _workload(40)
    too_long = TraceRequest(timestamp_s=base[-1].timestamp_s + 0.01, input_length=3000, output_length=10)
    result, sim = run([*base, too_long])
    rejected = result.requests[-1]
    assert not rejected.ok and rejected.error.startswith("HTTP 400: This model's maximum context length is 2048")
    assert rejected.e2e_s < 1e-9 and result.summary.num_failed == 1 and result.summary.num_ok == 40
    assert result.meta["e2e_mean_s"] == pytest.approx(result.summary.e2e_s.mean)  # over the 40 served
    assert all(ledger.in_flight == 0 for ledger in sim.ledgers)
    # the refusal landed mid-run and left the other requests exactly as without it
    alone, _ = run(base)
    key = [(r.backend, r.ttft_s, r.e2e_s, r.itl_s) for r in alone.requests]
    assert [(r.backend, r.ttft_s, r.e2e_s, r.itl_s) for r in result.requests[:-1]] == key


def test_views_carry_the_proxys_token_reservations_and_the_engines_cache_capacity() -> None:
    # least-load on in_flight_tokens: one long request on replica 0, then two short ones, all at
    # once; both short ones go to replica 1 only if the reservation (prompt + max tokens) is seen
    spec = EngineSpec(kind="vllm", scheduler={"block_size": 16, "max_model_len": -1}, num_gpu_blocks_override=5000)
    policy = create_policy("least-load:signal=in_flight_tokens", rng=random.Random(0))
    seen = []
    select = policy.select
    policy.select = lambda views, info: seen.append(list(views)) or select(views, info)  # type: ignore[method-assign]
    sim = FleetSim(make_replica=replica_factory(spec), num_replicas=2, policy=policy, make_job=job_factory(spec))
    workload = [TraceRequest(timestamp_s=0.0, input_length=3000, output_length=100),
                TraceRequest(timestamp_s=0.0, input_length=100, output_length=10),
                TraceRequest(timestamp_s=0.0, input_length=100, output_length=10)]
    result = sim.run(workload, label="tokens")
    assert [r.backend for r in result.requests] == ["0", "1", "1"]
    assert [v.in_flight_tokens for v in seen[2]] == [3100, 110]
    assert {v.cache_capacity_tokens for views in seen for v in views} == {5000 * 16}
    assert all(ledger.in_flight_tokens == 0 for ledger in sim.ledgers)


@pytest.mark.parametrize("blocks", [None, 400])
def test_the_policys_predicted_cache_hits_are_set_against_the_engines(blocks: int | None) -> None:
    from loadgen.synthetic import synthetic_requests

    workload = list(synthetic_requests("agents:sessions=8,turns=4,system=2000,output=32,think=2,stagger=0.2", seed=0))

    def run(policy: str) -> dict:
        spec = EngineSpec(kind="vllm", num_gpu_blocks_override=blocks, scheduler={"max_model_len": -1})
        sim = FleetSim(make_replica=replica_factory(spec), num_replicas=2, make_job=job_factory(spec),
                       policy=create_policy(policy, rng=random.Random(0)))
        return sim.run(workload, label=policy).meta

    meta = run("prefix-aware")
    predicted, observed = meta["prefix_cached_tokens_predicted"], meta["prefix_cached_tokens_observed"]
    assert observed == meta["prompt_tokens_reused"] > 0
    if blocks is None:  # the index sees exactly what the engines cache
        assert predicted == observed
    else:  # 400 blocks per replica: evictions the index cannot see
        assert predicted > observed
    assert run("round-robin")["prefix_cached_tokens_predicted"] is None


def test_the_replica_drives_the_core_through_the_engine_core_protocol_only() -> None:
    import inspect

    import sim.replicas

    source = inspect.getsource(sim.replicas)
    assert "Any" not in source and "getattr(" not in source and "hasattr(" not in source


def _async_run(async_scheduling: bool, workload: list[TraceRequest]) -> tuple:
    spec = EngineSpec(kind="vllm", scheduler={"block_size": 16, "max_num_seqs": 12, "max_model_len": -1,
                                              "async_scheduling": async_scheduling},
                      num_gpu_blocks_override=200)
    sim = FleetSim(make_replica=replica_factory(spec), num_replicas=2,
                   policy=create_policy("round-robin", rng=random.Random(0)), make_job=job_factory(spec))
    result = sim.run(workload, label="async" if async_scheduling else "sync")
    return sim, result


def test_async_scheduling_replicas_run_steps_back_to_back_and_serve_every_request() -> None:
    # one request alone: async schedules each step while the previous runs, and the GPU runs
    # them back to back, so its first token and its end come exactly when they do synchronously
    alone = [TraceRequest(timestamp_s=0.0, input_length=300, output_length=40)]
    (_, sync_one), (async_sim, async_one) = _async_run(False, alone), _async_run(True, alone)
    assert [(r.ttft_s, r.e2e_s) for r in async_one.requests] == [(r.ttft_s, r.e2e_s) for r in sync_one.requests]
    assert all(r.core.async_scheduling and not r.runs for r in async_sim.replicas)
    # under load a finished request holds its slot and blocks one step longer, so admissions lag
    _, sync_many = _async_run(False, _workload(120))
    _, async_many = _async_run(True, _workload(120))
    assert len(async_many.requests) == 120 and all(r.error is None for r in async_many.requests)
    assert [r.ttft_s for r in async_many.requests] != [r.ttft_s for r in sync_many.requests]
