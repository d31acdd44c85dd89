"""The look-alike vLLM core (`fake_engines.core.VllmScheduler`) behind the driver's `Core`,
step by step or, where the simulator would, with decode runs applied at once."""

from __future__ import annotations

from typing import Any

from bench.vllm_equivalence.driver import kind
from bench.vllm_equivalence.workloads import prompt_tokens
from fake_engines.core import EngineRequest, VllmScheduler, VllmSchedulerConfig


def config_for(settings: dict[str, Any]) -> VllmSchedulerConfig:
    """The fake's scheduler config for a workload's vLLM settings."""
    s = settings
    return VllmSchedulerConfig(
        num_gpu_blocks=s["num_gpu_blocks"], max_model_len=s["max_model_len"], max_num_seqs=s["max_num_seqs"],
        max_num_batched_tokens=s["max_num_batched_tokens"], block_size=s["block_size"],
        enable_prefix_caching=s["enable_prefix_caching"], max_loras=s["max_loras"],
        long_prefill_token_threshold=s["long_prefill_token_threshold"],
        scheduler_reserve_full_isl=s["scheduler_reserve_full_isl"], scheduling_policy=s["policy"],
        async_scheduling=s["async_scheduling"], seed=s["seed"])


class FakeCore:
    """The fake core driven step by step; with `decode_runs`, a stretch of identical decode
    steps is applied at once as the simulator does, and its steps recorded from the run."""

    def __init__(self, settings: dict[str, Any], decode_runs: bool = False) -> None:
        self.core = VllmScheduler(config_for(settings))
        self._n_prompt: dict[str, int] = {}
        self._arrival = 0.0
        self.decode_runs = decode_runs
        self._horizon = 0
        self._run_records: list[dict[str, Any]] = []

    def set_horizon(self, steps: int) -> None:
        """Steps until the next arrival or abort: a decode run stops before it."""
        self._horizon = steps

    def add(self, request: dict[str, Any]) -> None:
        tokens = prompt_tokens(request["prompt"])
        self._n_prompt[request["id"]] = len(tokens)
        self._arrival += 1.0  # as vllm_side numbers arrivals
        self.core.add_request(EngineRequest(request["id"], tokens, request["max_tokens"], request["max_tokens"],
                                            lora=request["lora"], arrival_s=self._arrival,
                                            priority=request["priority"]))

    def abort(self, request_id: str) -> bool:
        return self.core.abort_request(request_id)

    def has_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def schedule(self) -> tuple[Any, dict[str, Any]]:
        if self.decode_runs and not self._run_records:
            self._start_decode_run()
        if self._run_records:
            return None, self._run_records.pop(0)
        core = self.core
        step = core.schedule()
        if step is None:
            return None, {"sched": [], "new": [], "resumed": [], "preempted": [], "kv": round(core.kv_cache_usage, 6)}
        reqs = core.requests
        before = core.num_scheduled_computed_tokens if core.async_scheduling else (
            lambda rid: reqs[rid].num_computed_tokens + n_of[rid])
        n_of = step.num_scheduled_tokens
        sched = [[rid, n, kind(before(rid) - n, n, self._n_prompt[rid])] for rid, n in n_of.items()]
        new = [[rid, reqs[rid].num_computed_tokens] for rid in step.new_request_ids]
        resumed = [[rid, reqs[rid].num_computed_tokens] for rid in step.resumed_request_ids]
        record = {"sched": sched, "new": new, "resumed": resumed, "preempted": sorted(step.preempted_request_ids),
                  "kv": round(core.kv_cache_usage, 6)}
        return step, record

    def _start_decode_run(self) -> None:
        """As the simulator does: apply all but the last step of a decode run at once (the last
        goes through schedule and finish_step), recording each applied step as it would read."""
        core = self.core
        num_steps = min(core.decode_run_length(), self._horizon) - 1
        if num_steps < 1:
            return
        sched = [[r.request_id, 1, "d"] for r in core.running]
        self._run_records = [{"sched": sched, "new": [], "resumed": [], "preempted": [],
                              "kv": round(core.kv_cache_usage_after(i + 1), 6)} for i in range(num_steps)]
        core.apply_decode_steps(num_steps)

    def update(self, handle: Any) -> list[tuple[str, bool, bool]]:
        if handle is None:
            return []
        return [(o.request_id, o.is_first_token, o.finished) for o in self.core.finish_step(handle)]
