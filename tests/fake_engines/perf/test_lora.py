from __future__ import annotations

import pytest

from fake_engines.perf.lora import (
    LoraShape,
    llama_modules,
    tenant_memory,
    vllm_adapter_buffer_bytes,
    vllm_adapter_buffer_bytes_per_gpu,
)

BASE_BYTES = 8.03e9 * 2  # Llama 3 8B in BF16, as in the lesson


def llama3_8b() -> LoraShape:
    return LoraShape(llama_modules(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128), layers=32)


def test_seed_example_15_parameters_per_rank_per_layer() -> None:
    assert llama3_8b().params_per_rank_per_layer == 81920


@pytest.mark.parametrize(("rank", "params", "mb", "percent"), [
    (8, "20,971,520", "41.9", "0.26"),
    (16, "41,943,040", "83.9", "0.52"),
    (64, "167,772,160", "335.5", "2.09"),
])
def test_seed_example_15_adapter_sizes(rank: int, params: str, mb: str, percent: str) -> None:
    shape = llama3_8b()
    assert f"{shape.adapter_params(rank):,}" == params
    assert f"{shape.adapter_bytes(rank) / 1e6:.1f}" == mb
    assert f"{100 * shape.adapter_bytes(rank) / BASE_BYTES:.2f}" == percent


def test_seed_example_15_vllm_buffers_follow_the_flags() -> None:
    assert f"{vllm_adapter_buffer_bytes(llama3_8b(), max_loras=4, max_lora_rank=64) / 1e9:.2f}" == "1.34"
    assert vllm_adapter_buffer_bytes(llama3_8b(), 1, 8) == llama3_8b().adapter_bytes(8)


def test_seed_example_15_merged_versus_shared() -> None:
    mem = tenant_memory(llama3_8b(), BASE_BYTES, tenants=20, rank=16)
    assert (f"{mem.merged_bytes / 1e9:.1f}", f"{mem.shared_bytes / 1e9:.1f}") == ("321.2", "17.7")


def test_module_shapes_follow_grouped_query_attention() -> None:
    by_name = {m.name: (m.in_features, m.out_features) for m in llama3_8b().modules}
    assert by_name["k_proj"] == (4096, 1024)
    assert by_name["o_proj"] == (4096, 4096)
    assert by_name["down_proj"] == (14336, 4096)


def test_target_subset_counts_only_those_modules() -> None:
    qv = llama_modules(4096, 14336, 32, 8, 128, targets=("q_proj", "v_proj"))
    assert LoraShape(qv, 32).params_per_rank_per_layer == 8192 + 5120


def test_unknown_target_and_zero_slots_are_rejected() -> None:
    with pytest.raises(ValueError, match="targets"):
        llama_modules(4096, 14336, 32, 8, 128, targets=("qkv",))
    with pytest.raises(ValueError, match="max_loras"):
        vllm_adapter_buffer_bytes(llama3_8b(), 0, 64)


def test_moe_layers_adapt_every_expert_mlp_separately() -> None:
    modules = llama_modules(2048, 768, 32, 4, 128, experts=128)
    by_name = {m.name: m.params_per_rank for m in modules}
    assert by_name["gate_proj"] == 128 * (2048 + 768)
    assert by_name["q_proj"] == 2048 + 4096


def test_tensor_parallel_gpus_each_hold_the_sharded_side_of_every_buffer() -> None:
    shape = llama3_8b()
    whole = vllm_adapter_buffer_bytes(shape, 4, 64)
    assert vllm_adapter_buffer_bytes_per_gpu(shape, 4, 64, tp=1) == whole
    # tp=2: column layers keep A (hidden inputs) whole, row layers keep B (hidden outputs) whole
    per_layer = (4096 + 2048) + (4096 + 512) * 2 + (2048 + 4096) + (4096 + 7168) * 2 + (7168 + 4096)
    assert vllm_adapter_buffer_bytes_per_gpu(shape, 4, 64, tp=2) == 4 * 64 * per_layer * 32 * 2
    with pytest.raises(ValueError, match="tp"):
        vllm_adapter_buffer_bytes_per_gpu(shape, 4, 64, tp=0)


def test_step_cost_of_a_rank_16_llama_8b_adapter_by_hand():
    """Example 15's shape: 81,920 adapter parameters per rank per layer, 32 layers."""
    from fake_engines.perf.lora import LoraShape, LoraStepCost, llama_modules

    shape = LoraShape(llama_modules(4096, 14336, 32, 8, 128), 32)
    cost = LoraStepCost(shape, rank=16)
    assert cost.params_per_gpu == 16 * 81920 * 32 == 41_943_040  # the example's rank-16 count
    assert cost.weight_bytes(1) == 83_886_080 and cost.weight_bytes(3) == 3 * 83_886_080
    assert cost.flops(8) == 2 * 8 * 41_943_040  # shrink 2 r in + expand 2 r out per token and module
    # tp 2: q, k, v, gate, up shard B's outputs, o and down A's inputs; per rank per layer per GPU
    by_hand = (4096 + 2048) + 2 * (4096 + 512) + (2048 + 4096) + 2 * (4096 + 7168) + (7168 + 4096)
    assert by_hand == 55_296 and LoraStepCost(shape, 16, tp=2).params_per_gpu == 16 * 55_296 * 32


def test_a_steps_adapter_cost_grows_with_its_distinct_adapters():
    from fake_engines.perf.batch import Layout, StepBatch
    from fake_engines.perf.catalogue import load_catalogue
    from fake_engines.perf.lora import LoraShape, LoraStepCost, llama_modules
    from fake_engines.perf.step_time import device_work, step_time_s

    model, gpu = load_catalogue().model("llama-3.1-8b"), load_catalogue().gpu("h100")
    cost = LoraStepCost(LoraShape(llama_modules(4096, 14336, 32, 8, 128), 32), rank=16)
    batch = StepBatch(decode_seqs=8, decode_context_tokens=8000)
    base = device_work(model, batch, Layout())
    for adapters in (1, 2, 4):
        work = device_work(model, StepBatch(decode_seqs=8, decode_context_tokens=8000, lora_adapters=adapters), Layout(), lora=cost)
        assert work.weight_bytes - base.weight_bytes == adapters * 83_886_080
        assert work.flops - base.flops == 2 * 8 * 41_943_040
    times = [step_time_s(model, gpu, StepBatch(decode_seqs=8, decode_context_tokens=8000, lora_adapters=k), lora=cost) for k in (0, 1, 2, 4)]
    assert times[0] == step_time_s(model, gpu, batch) and times == sorted(times) and len(set(times)) == 4
    # memory-bound: each adapter adds about its bytes at the achieved bandwidth
    assert times[2] - times[0] == pytest.approx(2 * (times[1] - times[0]), rel=0.05)
