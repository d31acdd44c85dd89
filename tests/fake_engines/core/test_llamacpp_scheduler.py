import pytest

from fake_engines.core import (
    EngineRequest,
    FinishReason,
    LlamaCppScheduler,
    LlamaCppSchedulerConfig,
    RequestOutput,
    RequestRejected,
    ScheduledStep,
)


def _req(request_id: str, tokens: list[int], output_len: int = 4, lora: str | None = None) -> EngineRequest:
    return EngineRequest(request_id, tokens, max_tokens=output_len, output_len=output_len, lora=lora)


def _run(sched: LlamaCppScheduler) -> tuple[list[ScheduledStep], list[RequestOutput]]:
    steps, outputs = [], []
    while (step := sched.schedule()) is not None:
        steps.append(step)
        outputs += sched.finish_step(step)
    assert not sched.has_unfinished_requests()
    return steps, outputs


def _slot_of(sched: LlamaCppScheduler, request_id: str) -> int:
    return next(s.id for s in sched.stats().slots if s.request_id == request_id)


def test_two_slots_and_five_requests_defer_three():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=4096, n_parallel=2))
    for i in range(5):
        sched.add_request(_req(f"r{i}", [i] * 50))
    stats = sched.stats()
    assert (stats.num_running, stats.num_waiting) == (2, 3)
    assert [s.is_processing for s in stats.slots] == [True, True]
    _, outputs = _run(sched)
    assert sum(len(o.new_token_ids) for o in outputs) == 20


def test_auto_parallel_means_four_slots_sharing_the_whole_context():
    auto = LlamaCppSchedulerConfig(n_ctx=8192)
    explicit = LlamaCppSchedulerConfig(n_ctx=8192, n_parallel=2)
    assert (auto.num_slots, auto.slot_n_ctx) == (4, 8192)
    assert (explicit.num_slots, explicit.slot_n_ctx) == (2, 4096)
    assert LlamaCppSchedulerConfig(n_ctx=8192, n_ctx_train=2048).slot_n_ctx == 2048


def test_slot_is_picked_by_prompt_similarity_else_least_recently_used():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=4096, n_parallel=2))
    system = list(range(100))
    sched.add_request(_req("a", system + [1000] * 20))
    assert _slot_of(sched, "a") == 1  # both unused: the highest id, as the capture shows
    _run(sched)
    sched.add_request(_req("unrelated", list(range(500, 600))))
    assert _slot_of(sched, "unrelated") == 0  # slot 0 was never used: least recently used
    _run(sched)
    sched.add_request(_req("same-system", system + [2000] * 20))
    slot = sched.stats().slots[1]
    assert (slot.request_id, slot.n_prompt_tokens_cache, slot.n_prompt_tokens_processed) == ("same-system", 100, 20)
    _run(sched)
    sched.add_request(_req("low-similarity", system[:10] + [3000] * 200))
    assert _slot_of(sched, "low-similarity") == 0  # 10/210 < 0.10: LRU instead of slot 1


def test_identical_prompt_reuses_all_but_its_last_token():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=4096, n_parallel=1))
    sched.add_request(_req("a", list(range(64))))
    _run(sched)
    sched.add_request(_req("b", list(range(64))))
    step = sched.schedule()
    assert step.num_scheduled_tokens == {"b": 1}
    outputs = sched.finish_step(step)
    _run(sched)
    assert outputs[0].num_cached_tokens == 63
    stats = sched.stats()
    assert (stats.prompt_tokens_total, stats.prompt_tokens_cached_total) == (65, 63)


def test_lora_change_clears_the_slot_cache():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=4096, n_parallel=1))
    sched.add_request(_req("a", list(range(64)), lora="0:1.0"))
    _run(sched)
    sched.add_request(_req("b", list(range(64)), lora="1:1.0"))
    assert sched.schedule().num_scheduled_tokens == {"b": 64}


def test_mixed_lora_requests_take_turns():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=4096, n_parallel=2))
    sched.add_request(_req("a", [1] * 30, output_len=5, lora="0:1.0"))
    sched.add_request(_req("b", [2] * 30, output_len=5, lora="1:1.0"))
    steps, outputs = _run(sched)
    assert all(len(s.num_scheduled_tokens) == 1 for s in steps)
    # "a" took slot 1 and "b" slot 0; each iteration batches the first slot's LoRA only.
    assert [next(iter(s.num_scheduled_tokens)) for s in steps] == ["b"] * 5 + ["a"] * 5
    assert [o.request_id for o in outputs if o.finished] == ["b", "a"]


def test_same_lora_requests_share_iterations():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=4096, n_parallel=2))
    sched.add_request(_req("a", [1] * 30, output_len=5, lora="0:1.0"))
    sched.add_request(_req("b", [2] * 30, output_len=5, lora="0:1.0"))
    steps, _ = _run(sched)
    assert len(steps) == 5 and all(s.lora_adapters == {"0:1.0"} for s in steps)


def test_prompt_chunks_stop_at_n_batch_and_follow_the_decodes():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=8192, n_parallel=2, n_batch=512))
    sched.add_request(_req("short", [1] * 10, output_len=10))
    sched.finish_step(sched.schedule())
    sched.add_request(_req("long", [2] * 1200))
    steps = [sched.schedule()]
    sched.finish_step(steps[0])
    steps.append(sched.schedule())
    assert [list(s.num_scheduled_tokens.items()) for s in steps] == [
        [("short", 1), ("long", 511)], [("short", 1), ("long", 511)]]


def test_abort_frees_the_slot_for_a_deferred_request():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=4096, n_parallel=1))
    sched.add_request(_req("a", [1] * 10, output_len=50))
    sched.add_request(_req("b", [2] * 10))
    step = sched.schedule()
    assert sched.abort_request("a") and not sched.abort_request("a")
    assert sched.finish_step(step) == []
    stats = sched.stats()
    assert (stats.num_running, stats.num_waiting, stats.slots[0].request_id) == (1, 0, "b")
    assert sched.abort_request("b") and not sched.has_unfinished_requests()


def test_deferred_abort_removes_it_from_the_queue():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=4096, n_parallel=1))
    sched.add_request(_req("a", [1] * 10))
    sched.add_request(_req("b", [2] * 10))
    assert sched.abort_request("b")
    assert sched.stats().num_waiting == 0


def test_prompt_filling_the_slot_context_is_rejected_in_llama_server_words():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=2048, n_parallel=2))
    with pytest.raises(RequestRejected) as err:
        sched.add_request(_req("x", [1] * 3001))
    assert err.value.message == (
        "request (3001 tokens) exceeds the available context size (1024 tokens), try increasing it")
    assert (err.value.n_prompt_tokens, err.value.n_ctx) == (3001, 1024)


def test_generation_stops_with_length_when_the_slot_context_is_full():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=128, n_parallel=2))
    sched.add_request(_req("x", [1] * 60, output_len=100))
    _, outputs = _run(sched)
    assert outputs[-1].finish_reason is FinishReason.LENGTH and outputs[-1].num_output_tokens == 4


def test_unified_pool_defers_a_prompt_that_does_not_fit_the_free_cells():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=256, n_parallel=-1))
    sched.add_request(_req("a", [1] * 200, output_len=10))
    sched.add_request(_req("b", [2] * 100, output_len=10))
    assert (sched.stats().num_running, sched.stats().num_waiting) == (1, 1)
    _, outputs = _run(sched)
    assert {o.request_id for o in outputs if o.finished} == {"a", "b"}


def test_busy_slot_counters_follow_the_iterations():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=4096, n_parallel=2))
    sched.add_request(_req("a", [1] * 10, output_len=3))
    sched.add_request(_req("b", [2] * 10, output_len=3))
    _run(sched)
    stats = sched.stats()
    assert (stats.num_steps, stats.n_busy_slots_total, stats.n_tokens_max) == (3, 6, 13)
    assert stats.generation_tokens_total == 6 and stats.kv_cache_usage == 0.0


def _cached_on_return(cache_ram_tokens: int, n_parallel: int = 1) -> int:
    """Prompt A, then prompts unlike it on every slot, then A again: its cached tokens."""
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=4096, n_parallel=n_parallel,
                                                      cache_ram_tokens=cache_ram_tokens))
    prompt = list(range(1, 21))
    sched.add_request(_req("a", prompt))
    _run(sched)
    for i in range(n_parallel):
        sched.add_request(_req(f"other-{i}", [500 + i] * 30))
    _run(sched)
    sched.add_request(_req("a-again", prompt))
    return sched.requests["a-again"].num_cached_tokens or 0


def test_host_prompt_cache_gives_back_a_prompt_a_dissimilar_one_pushed_out_of_its_slot():
    """llama-server --cache-ram (captures llama.cpp/043, 044: 8 of 9 and 18 of 19 prompt tokens
    cached after other prompts took both slots): all but the last prompt token come back."""
    assert _cached_on_return(-1) == 19 and _cached_on_return(8192, n_parallel=2) == 19
    assert _cached_on_return(0) == 0  # --cache-ram 0: off
    assert _cached_on_return(10) == 0  # too small to hold the 24 tokens A left (20 prompt + 4 output)


def test_host_prompt_cache_keeps_a_prompt_per_lora_configuration():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=4096, n_parallel=1, cache_ram_tokens=-1))
    prompt = list(range(1, 21))
    sched.add_request(_req("a", prompt, lora="x"))
    _run(sched)
    sched.add_request(_req("b", [900] * 30))
    _run(sched)
    sched.add_request(_req("a-plain", prompt))
    assert sched.requests["a-plain"].num_cached_tokens == 0  # computed under another adapter


def test_a_prompt_only_request_computes_its_prompt_without_cache_reuse_and_draws_no_token():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=4096, n_parallel=1, n_batch=32))
    sched.add_request(_req("gen", list(range(64))))
    _run(sched)
    sched.add_request(EngineRequest("embed", list(range(64)), max_tokens=0, output_len=0))
    steps, outputs = _run(sched)
    # an embedding task is stateless: all 64 prompt tokens computed again, in n_batch chunks
    assert [s.num_scheduled_tokens["embed"] for s in steps] == [32, 32]
    assert [(o.new_token_ids, o.finished, o.finish_reason, o.is_first_token) for o in outputs] == \
        [((), True, FinishReason.STOP, True)]
    stats = sched.stats()
    assert (stats.prompt_tokens_total, stats.prompt_tokens_cached_total) == (128, 0)
    assert stats.generation_tokens_total == 4  # the generation request's tokens only


def _pinned(request_id: str, tokens: list[int], id_slot: int) -> EngineRequest:
    return EngineRequest(request_id, tokens, max_tokens=4, output_len=4, id_slot=id_slot)


@pytest.mark.parametrize(("unified", "idle_kept"), [(True, False), (False, True)])
def test_a_launch_saves_idle_slots_to_the_host_cache_and_a_unified_pool_clears_them(unified, idle_kept):
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=1024, n_parallel=2, kv_unified=unified,
                                                      cache_ram_tokens=-1))
    lines: list[str] = []
    sched.log = lines.append
    long = list(range(100, 160))
    sched.add_request(_pinned("a", long, 0))
    _run(sched)
    assert "__TEST_TAG_CACHE_IDLE_SLOT__" not in lines  # slot 1 held nothing to save
    sched.add_request(_pinned("b", [7, 8, 9], 1))
    assert lines.count("__TEST_TAG_CACHE_IDLE_SLOT__") == 1
    assert bool(sched.slots[0].cache_tokens) is idle_kept
    _run(sched)
    lines.clear()
    sched.add_request(_req("a-again", long))
    assert sched.requests["a-again"].num_cached_tokens == len(long) - 1  # from the slot or the host cache
    assert ("updating prompt cache" in lines) is not idle_kept  # an emptied slot is filled from the host
    _run(sched)


def test_no_cache_idle_slots_leaves_idle_slots_as_they_are():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=1024, n_parallel=2, kv_unified=True,
                                                      cache_ram_tokens=-1, cache_idle_slots=False))
    lines: list[str] = []
    sched.log = lines.append
    sched.add_request(_pinned("a", list(range(60)), 0))
    _run(sched)
    sched.add_request(_pinned("b", [7, 8, 9], 1))
    _run(sched)
    assert "__TEST_TAG_CACHE_IDLE_SLOT__" not in lines and len(sched.slots[0].cache_tokens) > 60


def test_slot_ids_wrap_as_llama_servers_and_a_slot_can_be_loaded_and_erased():
    sched = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=256, n_parallel=2, cache_ram_tokens=0))
    assert [getattr(sched.slot_by_id(i), "id", None) for i in (0, 1, 2, 3, -1, -2)] == [0, 1, 0, 1, None, 0]
    assert sched.load_slot(sched.slots[1], [5, 6, 7])
    sched.add_request(_req("r", [5, 6, 7, 8]))
    assert _slot_of(sched, "r") == 1 and sched.requests["r"].num_cached_tokens == 3
    _run(sched)
    assert sched.erase_slot(sched.slots[1]) == 4 + 4 - 1 and sched.slots[1].cache_tokens == []
    pool = LlamaCppScheduler(LlamaCppSchedulerConfig(n_ctx=256, n_parallel=2, kv_unified=True))
    pool.add_request(_pinned("busy", list(range(200)), 1))
    assert not pool.load_slot(pool.slots[0], list(range(100)))  # 56 cells left while slot 1 works
