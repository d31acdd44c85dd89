import random

import pytest

from fake_engines.core import (
    ConfigError,
    EngineRequest,
    FinishReason,
    RequestOutput,
    RequestRejected,
    RequestStatus,
    VllmScheduler,
    VllmSchedulerConfig,
)


def _req(request_id: str, tokens: list[int], output_len: int = 4, lora: str | None = None,
         max_tokens: int | None = None) -> EngineRequest:
    return EngineRequest(request_id, tokens, max_tokens=max_tokens or output_len, output_len=output_len,
                         lora=lora)


def _run(sched: VllmScheduler, max_steps: int = 10_000) -> list[RequestOutput]:
    outputs: list[RequestOutput] = []
    for _ in range(max_steps):
        step = sched.schedule()
        if step is None:
            break
        outputs += sched.finish_step(step)
    assert not sched.has_unfinished_requests()
    return outputs


def test_300_requests_with_256_seqs_leave_44_waiting():
    sched = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=10_000, max_num_seqs=256))
    for i in range(300):
        sched.add_request(_req(f"r{i}", [i] * 20, output_len=30))
    step = sched.schedule()
    stats = sched.stats()
    assert (stats.num_running, stats.num_waiting) == (256, 44)
    assert len(step.new_request_ids) == 256 and step.batch.prefill_tokens == 256 * 20
    while step is not None:
        sched.finish_step(step)
        assert sched.stats().num_running <= 256
        step = sched.schedule()
    assert sched.stats().generation_tokens_total == 300 * 30


def test_repeated_long_prompt_hits_its_full_blocks():
    sched = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=1000, max_num_batched_tokens=2048))
    prompt = list(range(1000))
    sched.add_request(_req("first", prompt))
    first = _run(sched)
    sched.add_request(_req("again", prompt))
    step = sched.schedule()
    assert step.batch.prefill_tokens == 1000 - 992
    again = [*sched.finish_step(step), *_run(sched)]
    assert first[0].num_cached_tokens == 0
    assert again[0].num_cached_tokens == 992 and again[0].is_first_token
    stats = sched.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (2000, 992)
    assert stats.prompt_tokens_total == 2000 and stats.prompt_tokens_computed_total == 1008


def _small_kv() -> VllmScheduler:
    # 6 usable blocks of 4 tokens: three 8-token prompts fill the cache exactly.
    return VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=7, block_size=4, max_model_len=24))


def test_small_kv_cache_preempts_the_newest_to_the_queue_head():
    sched = _small_kv()
    for i in range(4):
        sched.add_request(_req(f"r{i}", list(range(10 * i, 10 * i + 8)), output_len=8))
    sched.finish_step(sched.schedule())
    assert [r.request_id for r in sched.waiting] == ["r3"]
    step = sched.schedule()
    assert step.preempted_request_ids == ("r2",)
    assert list(step.num_scheduled_tokens.items()) == [("r0", 1), ("r1", 1)]
    assert [r.request_id for r in sched.waiting] == ["r2", "r3"]
    r2 = sched.waiting[0]
    assert (r2.status, r2.num_computed_tokens, r2.num_preemptions) == (RequestStatus.PREEMPTED, 0, 1)
    assert sched.kv_cache_manager.get_block_ids("r0") == [1, 2, 6]
    assert sched.kv_cache_manager.get_block_ids("r1") == [3, 4, 5]
    assert sched.stats().num_preemptions == 1


def test_preempted_request_recomputes_and_still_yields_all_its_tokens():
    sched = _small_kv()
    for i in range(4):
        sched.add_request(_req(f"r{i}", list(range(10 * i, 10 * i + 8)), output_len=8))
    steps, outputs = [], []
    while (step := sched.schedule()) is not None:
        steps.append(step)
        outputs += sched.finish_step(step)
    assert [s.step_id for s in steps if "r2" in s.resumed_request_ids] != []
    assert not any("r2" in s.new_request_ids for s in steps[1:])
    tokens: dict[str, int] = {}
    for out in outputs:
        tokens[out.request_id] = tokens.get(out.request_id, 0) + len(out.new_token_ids)
    assert tokens == {"r0": 8, "r1": 8, "r2": 8, "r3": 8}
    stats = sched.stats()
    assert stats.num_preemptions >= 1 and stats.kv_cache_usage == 0.0
    assert stats.prompt_tokens_computed_total > 4 * 8  # recompute shows up as extra prefill work


def test_no_waiting_request_is_admitted_in_a_step_with_a_preemption():
    sched = _small_kv()
    for i in range(3):
        sched.add_request(_req(f"r{i}", list(range(10 * i, 10 * i + 8)), output_len=8))
    sched.finish_step(sched.schedule())
    sched.add_request(_req("tiny", [77]))
    step = sched.schedule()
    assert step.preempted_request_ids == ("r2",) and "tiny" not in step.num_scheduled_tokens


def test_chunked_prefill_respects_the_token_budget():
    sched = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=100, max_num_batched_tokens=64))
    sched.add_request(_req("short", [1, 2, 3], output_len=10))
    sched.finish_step(sched.schedule())
    sched.add_request(_req("long", list(range(200)), output_len=2))
    chunks = []
    while not chunks or chunks[-1] != 1:
        step = sched.schedule()
        assert sum(step.num_scheduled_tokens.values()) <= 64
        chunks.append(step.num_scheduled_tokens["long"])
        outs = sched.finish_step(step)
    assert chunks == [63, 63, 63, 11, 1]
    assert [o.request_id for o in outs if o.is_first_token] == []
    assert step.batch.decode_seqs == 2


def test_long_prefill_threshold_caps_each_chunk():
    config = VllmSchedulerConfig(num_gpu_blocks=100, max_num_batched_tokens=512, long_prefill_token_threshold=50)
    sched = VllmScheduler(config)
    sched.add_request(_req("long", list(range(120))))
    sched.add_request(_req("other", list(range(500, 620))))
    sizes = []
    for _ in range(3):
        step = sched.schedule()
        sizes.append(step.num_scheduled_tokens["long"])
        sched.finish_step(step)
    assert sizes == [50, 50, 20]


def test_long_prefill_threshold_is_ignored_while_one_request_is_in_the_engine():
    # vLLM 0.32 Scheduler.schedule: with nobody to starve, the lone prefill uses the whole budget
    config = VllmSchedulerConfig(num_gpu_blocks=100, max_num_batched_tokens=512, long_prefill_token_threshold=50)
    sched = VllmScheduler(config)
    sched.add_request(_req("long", list(range(120))))
    step = sched.schedule()
    assert step.num_scheduled_tokens == {"long": 120}


def test_max_loras_limits_distinct_adapters_per_step():
    sched = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=100, max_loras=2))
    for i, lora in enumerate(["a", "b", "c", "a"]):
        sched.add_request(_req(f"r{i}", [i] * 8, output_len=3, lora=lora))
    step = sched.schedule()
    assert list(step.num_scheduled_tokens) == ["r0", "r1", "r3"]
    assert step.lora_adapters == {"a", "b"} and step.batch.lora_adapters == 2
    assert sched.stats().waiting_lora_adapters == ("c",)
    steps = [step]
    sched.finish_step(step)
    while (step := sched.schedule()) is not None:
        steps.append(step)
        sched.finish_step(step)
    assert all(len(s.lora_adapters) <= 2 for s in steps)
    assert any("r2" in s.new_request_ids for s in steps)


def test_mixed_lora_requests_share_steps():
    sched = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=100, max_loras=4))
    sched.add_request(_req("a", [1] * 8, output_len=5, lora="sql"))
    sched.add_request(_req("b", [2] * 8, output_len=5, lora="chat"))
    step = sched.schedule()
    while step is not None:
        assert set(step.num_scheduled_tokens) == {"a", "b"}
        assert step.batch.lora_adapters == 2
        sched.finish_step(step)
        step = sched.schedule()


def test_abort_frees_blocks_and_skips_the_in_flight_step():
    sched = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=11, block_size=4, max_model_len=40))
    sched.add_request(_req("a", list(range(10)), output_len=20))
    sched.add_request(_req("b", list(range(50, 60)), output_len=20))
    step = sched.schedule()
    assert sched.stats().kv_cache_usage == 0.6
    assert sched.abort_request("a") and not sched.abort_request("a") and not sched.abort_request("nope")
    assert sched.stats().kv_cache_usage == pytest.approx(0.3)
    assert [o.request_id for o in sched.finish_step(step)] == ["b"]
    assert sched.stats().num_aborted == 1


def test_finishes_with_stop_before_max_tokens_and_length_at_it():
    sched = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=100))
    sched.add_request(_req("eos", [1, 2], output_len=3, max_tokens=10))
    sched.add_request(_req("cap", [3, 4], output_len=10, max_tokens=3))
    last = {o.request_id: o for o in _run(sched) if o.finished}
    assert last["eos"].finish_reason is FinishReason.STOP and last["eos"].num_output_tokens == 3
    assert last["cap"].finish_reason is FinishReason.LENGTH and last["cap"].num_output_tokens == 3


def test_same_seed_gives_same_tokens_and_another_seed_differs():
    def tokens(seed: int) -> list[tuple[int, ...]]:
        sched = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=100, seed=seed))
        sched.add_request(_req("x", [5, 6, 7], output_len=12))
        return [o.new_token_ids for o in _run(sched)]

    assert tokens(1) == tokens(1)
    assert tokens(1) != tokens(2)


def test_pipeline_parallel_keeps_steps_in_flight_without_rescheduling_their_requests():
    sched = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=100, max_concurrent_batches=2))
    sched.add_request(_req("a", [1] * 8, output_len=4))
    first = sched.schedule()
    sched.add_request(_req("b", [2] * 8, output_len=4))
    second = sched.schedule()
    assert list(first.num_scheduled_tokens) == ["a"] and list(second.num_scheduled_tokens) == ["b"]
    assert sched.schedule() is None
    sched.finish_step(first)
    assert list(sched.schedule().num_scheduled_tokens) == ["a"]


@pytest.mark.parametrize(("prompt_len", "max_tokens", "fragment"), [
    (2049, 8, "your prompt contains at least 2049 input tokens"),
    (10, 4000, "max_tokens=4000 cannot be greater than max_model_len=2048"),
    (2000, 100, "your request has 2000 input tokens (100 > 2048 - 2000)"),
])
def test_requests_beyond_max_model_len_are_rejected(prompt_len, max_tokens, fragment):
    sched = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=1000, max_model_len=2048))
    with pytest.raises(RequestRejected) as err:
        sched.add_request(_req("x", [1] * prompt_len, output_len=max_tokens))
    assert fragment in err.value.message
    assert (err.value.n_prompt_tokens, err.value.n_ctx) == (prompt_len, 2048)


def test_request_the_whole_cache_cannot_hold_is_rejected_instead_of_waiting_forever():
    # 3 blocks of 4 tokens, one of them vLLM's null block: 8 usable token slots.
    sched = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=3, block_size=4, max_model_len=12))
    sched.add_request(_req("fits", [1] * 5, output_len=4))
    with pytest.raises(RequestRejected) as err:
        sched.add_request(_req("too-big", [1] * 6, output_len=4))
    assert (err.value.n_prompt_tokens, err.value.n_ctx) == (6, 8)
    assert len(_run(sched)) == 4


# -- KV cache events (issue 18) -------------------------------------------------------------------

def _events_engine(enable: bool = True) -> VllmScheduler:
    return VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=10, block_size=4, max_model_len=32, max_num_seqs=4,
                                             enable_kv_cache_events=enable))


def _run_all(sched: VllmScheduler) -> list[list]:
    """Steps until idle, draining events after each finish_step as a driver does: the batches."""
    batches = []
    while sched.has_unfinished_requests():
        step = sched.schedule()
        assert step is not None
        sched.finish_step(step)
        events = sched.take_kv_events()
        if events:
            batches.append(events)
    return batches


def test_kv_events_add_up_to_the_prefix_cache_after_evictions_and_a_reset() -> None:
    from collections import Counter

    from flotilla.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    sched, rng, held = _events_engine(), random.Random(7), Counter()
    shared = [rng.randrange(1000) for _ in range(8)]
    for i in range(40):
        prompt = (shared if i % 2 else []) + [rng.randrange(1000) for _ in range(rng.randrange(1, 16))]
        sched.add_request(EngineRequest(f"r{i}", prompt, max_tokens=6, output_len=rng.randrange(1, 6),
                                        lora="a" if i % 5 == 0 else None))
        if i % 3 == 2:
            for event in (e for batch in _run_all(sched) for e in batch):
                if isinstance(event, BlockStored):
                    held.update(event.block_hashes)
                elif isinstance(event, BlockRemoved):
                    held.subtract(event.block_hashes)
                elif isinstance(event, AllBlocksCleared):
                    held.clear()
            assert {h for h, n in held.items() if n > 0} == set(sched.cached_block_hashes())
        if i == 20:
            assert sched.reset_prefix_cache() and sched.cached_block_hashes() == []
    assert any(n == 0 for n in held.values()), "the workload evicted blocks"


def test_kv_events_chain_parents_and_skip_prefix_hits() -> None:
    from flotilla.kv_events import BlockStored

    sched = _events_engine()
    sched.add_request(EngineRequest("a", list(range(10)), max_tokens=1, output_len=1))
    [[stored]] = _run_all(sched)
    assert isinstance(stored, BlockStored) and stored.parent_block_hash is None
    assert stored.token_ids == list(range(8)) and len(stored.block_hashes) == 2
    sched.add_request(EngineRequest("b", list(range(8)) + [50, 51, 52, 53, 54], max_tokens=1, output_len=1))
    [[after_hit]] = _run_all(sched)
    assert after_hit.parent_block_hash == stored.block_hashes[-1] and after_hit.token_ids == [50, 51, 52, 53]


def test_reset_prefix_cache_refuses_while_blocks_are_held_and_events_off_queue_nothing() -> None:
    sched = _events_engine(enable=False)
    sched.add_request(EngineRequest("a", list(range(10)), max_tokens=4, output_len=4))
    step = sched.schedule()
    assert step is not None and not sched.reset_prefix_cache(), "a running request holds blocks"
    sched.finish_step(step)
    assert _run_all(sched) == [] and sched.take_kv_events() == []
    assert sched.reset_prefix_cache() and sched.cached_block_hashes() == []


def test_async_scheduling_schedules_a_request_again_while_its_step_is_in_flight():
    # vLLM's AsyncScheduler: step t+1 is scheduled before step t's token is known (a placeholder),
    # and no step is scheduled past max_tokens
    sched = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=20, async_scheduling=True))
    assert sched.max_concurrent_batches == 2
    sched.add_request(_req("r", list(range(10)), output_len=3))
    first = sched.schedule()
    second = sched.schedule()
    assert first.num_scheduled_tokens == {"r": 10} and second.num_scheduled_tokens == {"r": 1}
    assert sched.schedule() is None  # two steps in flight
    assert [o.num_output_tokens for o in sched.finish_step(first)] == [1]
    third = sched.schedule()
    assert third.num_scheduled_tokens == {"r": 1}
    assert [o.num_output_tokens for o in sched.finish_step(second)] == [2]
    assert sched.schedule() is None  # the step in flight samples the last token
    (last,) = sched.finish_step(third)
    assert last.finished and last.num_output_tokens == 3
    assert not sched.has_unfinished_requests() and sched.kv_cache_usage == 0.0


def test_async_scheduling_with_pipeline_parallelism_is_refused():
    with pytest.raises(ConfigError, match="async_scheduling"):
        VllmSchedulerConfig(num_gpu_blocks=20, async_scheduling=True, max_concurrent_batches=2)


def test_priority_policy_admits_the_smallest_priority_first_and_preempts_the_largest():
    config = VllmSchedulerConfig(num_gpu_blocks=8, block_size=4, max_num_seqs=2, scheduling_policy="priority")
    sched = VllmScheduler(config)
    sched.add_request(EngineRequest("low", list(range(12)), 8, 8, arrival_s=1.0, priority=5))
    sched.add_request(EngineRequest("high", list(range(100, 112)), 8, 8, arrival_s=2.0, priority=0))
    step = sched.schedule()
    assert list(step.num_scheduled_tokens) == ["high", "low"]
    sched.finish_step(step)
    preempted = []
    while not preempted:
        step = sched.schedule()
        preempted = list(step.preempted_request_ids)
        sched.finish_step(step)
    assert preempted == ["low"]
