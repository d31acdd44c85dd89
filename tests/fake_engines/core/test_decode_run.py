"""Decode runs applied at once leave the engine core exactly as step by step would."""

from __future__ import annotations

import random

import pytest

from fake_engines.core import EngineRequest, VllmScheduler, VllmSchedulerConfig


def _engine(block_size: int, blocks: int) -> VllmScheduler:
    sched = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=blocks, block_size=block_size, max_model_len=200))
    rng = random.Random(block_size)
    shared = [rng.randrange(1000) for _ in range(3 * block_size)]  # a cached prefix for some requests
    for i in range(5):
        prompt = (shared if i % 2 else []) + [rng.randrange(1000) for _ in range(rng.randint(1, 30))]
        sched.add_request(EngineRequest(f"r{i}", prompt, max_tokens=60, output_len=rng.randint(8, 60)))
    for _ in range(2):  # prefill, then one decode so every request holds an output token
        step = sched.schedule()
        assert step is not None
        sched.finish_step(step)
    return sched


def _state(sched: VllmScheduler) -> tuple:
    kv = sched.kv_cache_manager
    return (
        [(r.request_id, r.num_computed_tokens, list(r.output_token_ids), kv.get_block_ids(r.request_id))
         for r in sched.running],
        kv.block_pool.free_block_queue.block_ids(),
        sorted((h, b.block_id) for h, b in kv.block_pool.cached_block_hash_to_block.items()),
        sched.stats(), sched._next_step_id,
    )


@pytest.mark.parametrize(("block_size", "blocks"), [(1, 400), (1, 200), (4, 120), (16, 40)])
def test_applied_run_equals_the_same_steps_one_by_one(block_size: int, blocks: int) -> None:
    fast, slow = _engine(block_size, blocks), _engine(block_size, blocks)
    length = fast.decode_run_length()
    assert length >= 2
    fast.apply_decode_steps(length - 1)
    for _ in range(length - 1):
        step = slow.schedule()
        assert step is not None and step.batch.prefill_tokens == 0
        assert not any(o.finished for o in slow.finish_step(step))
    assert _state(fast) == _state(slow)
    last_fast, last_slow = fast.schedule(), slow.schedule()
    assert last_fast == last_slow
    assert fast.finish_step(last_fast) == slow.finish_step(last_slow)
    assert _state(fast) == _state(slow)


def test_run_ends_with_the_step_that_finishes_the_first_request() -> None:
    sched = _engine(16, 400)
    left = min(r.target_output_len - len(r.output_token_ids) for r in sched.running)
    assert sched.decode_run_length() == left
    sched.apply_decode_steps(left - 1)
    step = sched.schedule()
    assert step is not None
    assert any(o.finished for o in sched.finish_step(step))


def test_run_stops_before_the_kv_cache_would_run_out() -> None:
    sched = _engine(1, 200)  # one token per block: every decode step takes 5 blocks of 71 free
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 71
    assert sched.decode_run_length() == 14 < _engine(1, 400).decode_run_length()
    sched.apply_decode_steps(14)
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 1
    step = sched.schedule()  # the 15th step cannot fit all five: someone is preempted
    assert step is not None and step.preempted_request_ids


def test_no_run_while_a_request_waits_or_prefills() -> None:
    sched = VllmScheduler(VllmSchedulerConfig(num_gpu_blocks=100))
    sched.add_request(EngineRequest("a", [1, 2, 3], max_tokens=10, output_len=10))
    assert sched.decode_run_length() == 0  # waiting
    step = sched.schedule()
    assert sched.decode_run_length() == 0  # its step is in flight
    assert step is not None
    sched.finish_step(step)
    assert sched.decode_run_length() == 9
    first, context_step = sched.decode_run_batch()
    assert (first.decode_seqs, first.decode_context_tokens, first.prefill_tokens, context_step) == (1, 4, 0, 1)


def test_kv_usage_mid_run_is_what_the_stepped_engine_reports() -> None:
    sched = _engine(1, 200)
    predicted = [sched.kv_cache_usage_after(n) for n in range(1, 15)]
    seen = []
    for _ in range(14):
        step = sched.schedule()
        assert step is not None
        seen.append(sched.stats().kv_cache_usage)  # read while the step is under way
        sched.finish_step(step)
    assert predicted == seen


def test_schedulers_and_decode_runs_reach_the_kv_cache_only_through_the_managers_public_api() -> None:
    import inspect
    import re

    from fake_engines.core import _decode_run, _llamacpp_decode_run, _llamacpp_scheduler, _vllm_scheduler

    for module in (_vllm_scheduler, _decode_run, _llamacpp_scheduler, _llamacpp_decode_run):
        source = inspect.getsource(module)
        assert "block_pool" not in source, module.__name__
        assert not re.search(r"\b(kv|kv_cache_manager|sched)\._", source), module.__name__
