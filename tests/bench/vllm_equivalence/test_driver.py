"""The equivalence bench's engine loop and workloads (the vLLM side needs the vLLM venv; the
golden traces it wrote are replayed in tests/fake_engines/core/test_vllm_golden.py)."""

from __future__ import annotations

from bench.vllm_equivalence import driver, workloads
from bench.vllm_equivalence.fake_side import FakeCore


def test_workloads_are_reproducible_and_fit_the_context_vllm_would_start_with() -> None:
    for workload in [*workloads.named(), *(workloads.random_workload(seed) for seed in range(50))]:
        s = workload["settings"]
        assert s["max_model_len"] <= (s["num_gpu_blocks"] - 1) * s["block_size"]
        for request in workload["requests"]:
            assert len(workloads.prompt_tokens(request["prompt"])) + request["max_tokens"] <= s["max_model_len"]
    assert workloads.random_workload(7) == workloads.random_workload(7)
    assert workloads.prompt_tokens([[1, 5], [2, 3]])[:5] == workloads.prompt_tokens([[1, 5]])


def test_async_loop_applies_each_output_one_pass_after_its_step() -> None:
    workload = workloads.all_at_once()
    sync = driver.run(FakeCore(workload["settings"]), workload)
    async_workload = workloads.with_async([workload])[1]
    trace = driver.run(FakeCore(async_workload["settings"]), async_workload)
    assert len(trace["steps"]) > len(sync["steps"])  # finished requests hold their slot a step longer
    assert all(r["finish_step"] is not None for r in trace["requests"].values())


def test_compare_counts_identical_steps_and_names_the_first_difference() -> None:
    workload = workloads.aborts()
    golden = driver.run(FakeCore(workload["settings"]), workload)
    assert driver.compare(golden, golden)[2] == []
    changed = {**golden, "steps": [dict(s) for s in golden["steps"]]}
    changed["steps"][3]["kv"] = 0.5
    same, total, notes = driver.compare(golden, changed)
    assert (same, total) == (total - 1, len(golden["steps"])) and notes[0].startswith("step 3:")
