"""Invariants every EngineCore keeps under random add / abort / schedule / finish sequences."""

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from fake_engines.core import (
    EngineCore,
    EngineRequest,
    FinishReason,
    LlamaCppScheduler,
    LlamaCppSchedulerConfig,
    RequestOutput,
    RequestRejected,
    VllmScheduler,
    VllmSchedulerConfig,
)

_SHARED_PREFIX = list(range(1000, 1040))
_LORAS = [None, "a", "b", "c"]

_add = st.tuples(st.just("add"), st.integers(1, 60), st.integers(1, 12), st.sampled_from(_LORAS), st.booleans())
_abort = st.tuples(st.just("abort"), st.integers(0, 40))
_schedule = st.tuples(st.just("schedule"))
_finish = st.tuples(st.just("finish"))
_ops = st.lists(st.one_of(_add, _abort, _schedule, _finish, _finish), max_size=80)


class _Harness:
    """Drives one core and checks what any driver may rely on after every call."""

    def __init__(self, core: EngineCore, max_running: int, max_loras: int, budget: int) -> None:
        self.core, self.max_running, self.max_loras, self.budget = core, max_running, max_loras, budget
        self.in_flight: deque = deque()
        self.added: dict[str, EngineRequest] = {}
        self.aborted: set[str] = set()
        self.finished: dict[str, RequestOutput] = {}
        self.tokens: dict[str, int] = {}
        self.emitted = 0

    def add(self, n: int, prompt_len: int, output_len: int, lora: str | None, shared: bool) -> None:
        prompt = (_SHARED_PREFIX if shared else []) + [n * 7 + i for i in range(prompt_len)]
        request = EngineRequest(f"r{n}", prompt, max_tokens=output_len, output_len=output_len, lora=lora)
        try:
            self.core.add_request(request)
        except RequestRejected:
            return
        self.added[request.request_id] = request

    def abort(self, index: int) -> None:
        ids = sorted(self.added)
        if ids:
            request_id = ids[index % len(ids)]
            live = request_id not in self.aborted and request_id not in self.finished
            assert self.core.abort_request(request_id) == live
            self.aborted.add(request_id)

    def schedule(self) -> None:
        step = self.core.schedule()
        if step is None:
            return
        assert 0 < sum(step.num_scheduled_tokens.values()) <= self.budget
        assert len(step.lora_adapters) <= self.max_loras
        assert step.batch.lora_adapters == len(step.lora_adapters)
        assert not self.aborted & set(step.num_scheduled_tokens)
        self.in_flight.append(step)

    def finish(self) -> None:
        if self.in_flight:
            for out in self.core.finish_step(self.in_flight.popleft()):
                self.record(out)

    def record(self, out: RequestOutput) -> None:
        rid = out.request_id
        assert rid not in self.finished and rid not in self.aborted
        self.tokens[rid] = self.tokens.get(rid, 0) + len(out.new_token_ids)
        self.emitted += len(out.new_token_ids)
        assert out.num_output_tokens == self.tokens[rid]
        assert out.is_first_token == (self.tokens[rid] == 1)
        if out.finished:
            self.finished[rid] = out

    def check(self) -> None:
        stats = self.core.stats()
        assert stats.num_running <= self.max_running
        assert 0.0 <= stats.kv_cache_usage <= 1.0
        assert stats.prefix_cache_hits <= stats.prefix_cache_queries
        assert stats.generation_tokens_total == self.emitted

    def drain(self) -> None:
        for _ in range(20_000):
            self.finish()
            self.schedule()
            if not self.in_flight:
                break
        assert not self.core.has_unfinished_requests()
        assert self.core.stats().kv_cache_usage == 0.0
        for rid, request in self.added.items():
            if rid in self.aborted:
                continue
            out = self.finished[rid]
            if out.finish_reason is FinishReason.LENGTH:
                assert out.num_output_tokens <= request.max_tokens
            else:
                assert out.num_output_tokens == request.output_len

    def play(self, ops: list[tuple]) -> None:
        for n, op in enumerate(ops):
            if op[0] == "add":
                self.add(n, *op[1:])
            else:
                getattr(self, op[0])(*op[1:])
            self.check()
        self.drain()
        self.check()


def _check_block_refs(sched: VllmScheduler) -> None:
    kv = sched.kv_cache_manager
    pool = kv.block_pool
    free = set(pool.free_block_queue.block_ids())
    assert all(b.ref_cnt == 0 for b in pool.blocks if b.block_id in free)
    held = sum(len(kv.get_block_ids(r.request_id)) for r in sched.running)
    assert sum(b.ref_cnt for b in pool.blocks) == held


@settings(max_examples=60, deadline=None)
@given(_ops, st.integers(1, 2), st.integers(1, 3), st.booleans())
def test_vllm_core_keeps_its_invariants(ops, pp, max_loras, caching):
    config = VllmSchedulerConfig(num_gpu_blocks=12, block_size=8, max_num_seqs=4, max_num_batched_tokens=48,
                                 max_loras=max_loras, enable_prefix_caching=caching, max_concurrent_batches=pp,
                                 max_model_len=80)
    sched = VllmScheduler(config)
    harness = _Harness(sched, max_running=4, max_loras=max_loras, budget=48)
    original_check = harness.check

    def check() -> None:
        original_check()
        _check_block_refs(sched)

    harness.check = check
    harness.play(ops)


@settings(max_examples=60, deadline=None)
@given(_ops, st.sampled_from([-1, 1, 2, 3]), st.sampled_from([0.0, 0.1, 0.5]))
def test_llamacpp_core_keeps_its_invariants(ops, n_parallel, similarity):
    config = LlamaCppSchedulerConfig(n_ctx=240, n_parallel=n_parallel, n_batch=32,
                                     slot_prompt_similarity=similarity)
    sched = LlamaCppScheduler(config)
    harness = _Harness(sched, max_running=config.num_slots, max_loras=1, budget=32)
    harness.play(ops)
