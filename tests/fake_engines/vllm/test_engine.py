"""Sizing the fake vLLM from its flags: batch defaults, KV blocks, refusals in vLLM's words."""

from __future__ import annotations

import pytest

from fake_engines.perf.batch import Layout
from fake_engines.perf.catalogue import load_catalogue
from fake_engines.perf.kv_cache import kv_cache_blocks
from fake_engines.vllm.config import ServeConfigError, VllmServeConfig
from fake_engines.vllm.engine import ModelDoesNotFit, cache_config_labels, size_engine


def _size(**flags):
    config = VllmServeConfig(**{"model": "llama-3.1-8b", **flags})
    return config, size_engine(config)


def test_batch_defaults_follow_the_gpu_as_vllm_get_batch_defaults():
    assert (_size(gpu="h100")[1].max_num_seqs, _size(gpu="h100")[1].max_num_batched_tokens) == (1024, 8192)
    assert (_size(gpu="a100")[1].max_num_seqs, _size(gpu="a100")[1].max_num_batched_tokens) == (256, 2048)
    assert _size(max_num_seqs=7)[1].max_num_seqs == 7


def test_kv_blocks_come_from_the_capacity_model_or_the_override():
    catalogue = load_catalogue()
    config, spec = _size(gpu="h100", tensor_parallel_size=2)
    assert spec.num_gpu_blocks == kv_cache_blocks(catalogue.model("llama-3.1-8b"), catalogue.gpu("h100"),
                                                  Layout(tp=2), 0.9, 16, 2)
    assert _size(num_gpu_blocks_override=512, max_model_len=8192)[1].num_gpu_blocks == 512
    labels = cache_config_labels(config, spec)
    assert labels["num_gpu_blocks"] == str(spec.num_gpu_blocks)
    assert labels["kv_cache_size_tokens"] == str(spec.num_gpu_blocks * 16)
    assert labels["user_specified_block_size"] == "False" and labels["enable_prefix_caching"] == "True"


def test_70b_needs_enough_gpus():
    with pytest.raises(ModelDoesNotFit, match="CUDA out of memory"):
        _size(model="llama-3.1-70b")
    with pytest.raises(ModelDoesNotFit, match="No available memory for the cache blocks"):
        _size(model="llama-3.1-70b", tensor_parallel_size=2)
    assert _size(model="llama-3.1-70b", tensor_parallel_size=4)[1].num_gpu_blocks > 0


def test_max_model_len_beyond_the_kv_cache_is_refused_with_the_estimate():
    with pytest.raises(ModelDoesNotFit, match="estimated maximum model length is 160"):
        _size(num_gpu_blocks_override=10, max_model_len=8192)


def test_max_model_len_defaults_to_the_models_context_which_the_kv_cache_must_hold_as_in_vllm():
    assert _size(gpu="h100")[1].max_model_len == 131072  # llama-3.1-8b's max_position_embeddings
    assert _size(model="mistral-7b")[1].max_model_len == 32768
    # 16 GiB for one 128K request on a 24 GB card: vLLM refuses to start, and says what would fit
    with pytest.raises(ModelDoesNotFit, match=r"max seq len \(131072\).*estimated maximum model length is 27008"):
        _size(gpu="rtx4090")
    assert _size(gpu="rtx4090", max_model_len=8192)[1].max_model_len == 8192


def test_max_model_len_auto_fits_the_kv_cache_up_to_the_models_context():
    assert _size(gpu="rtx4090", max_model_len=-1)[1].max_model_len == 27008 - 16  # less the null block
    assert _size(gpu="h100", max_model_len=-1)[1].max_model_len == 131072


def test_unset_batch_limits_are_fitted_to_max_model_len_and_to_each_other_as_vllm_does():
    # max_num_batched_tokens = min(max_num_seqs * max_model_len, the GPU's default); max_num_seqs
    # then no more than the budget (_set_default_max_num_seqs_and_batched_tokens_args)
    spec = _size(max_num_batched_tokens=512)[1]
    assert (spec.max_num_batched_tokens, spec.max_num_seqs) == (512, 512)
    spec = _size(max_model_len=4, max_num_seqs=2, gpu="a100")[1]
    assert (spec.max_num_batched_tokens, spec.max_num_seqs) == (8, 2)
    with pytest.raises(ServeConfigError, match=r"max_num_batched_tokens \(64\) must be greater than or equal"):
        _size(max_num_batched_tokens=64, max_num_seqs=128)


def test_bad_flags_name_the_flag():
    with pytest.raises(ServeConfigError, match="--gpu-memory-utilization"):
        VllmServeConfig(model="m", gpu_memory_utilization=1.5)
    with pytest.raises(ServeConfigError, match="--lora-modules needs --enable-lora"):
        VllmServeConfig(model="m", lora_modules={"a": "/a"})


def test_an_explicit_shape_sizes_like_the_same_catalogue_model():
    shape = {"params": 8.03e9, "layers": 32, "kv_heads": 8, "head_dim": 128, "hidden": 4096, "heads": 32}
    explicit = _size(model="my-8b", model_shape=shape)[1]
    assert explicit.model.name == "my-8b"
    assert explicit.num_gpu_blocks == _size()[1].num_gpu_blocks
    with pytest.raises(ServeConfigError, match="--kv-heads"):
        VllmServeConfig(model="x", model_shape={"params": 1e9, "layers": 4})


def test_lora_buffers_take_kv_blocks_as_max_loras_and_rank_grow():
    from fake_engines.vllm.engine import lora_reserve_bytes

    plain = _size()[1].num_gpu_blocks
    config, small = _size(enable_lora=True, max_loras=1, max_lora_rank=16)
    big_config, big = _size(enable_lora=True, max_loras=8, max_lora_rank=64)
    assert plain > small.num_gpu_blocks > big.num_gpu_blocks
    block_bytes = 16 * 2 * 32 * 8 * 128 * 2  # tokens x (K, V) x layers x kv heads x head dim x bf16
    reserve = lora_reserve_bytes(big_config, big.model, big.layout)
    assert plain - big.num_gpu_blocks == pytest.approx(reserve / block_bytes, abs=1)


def test_enable_lora_adds_the_adapters_reads_and_flops_to_the_steps_that_use_them():
    """llama-3.1-8b at --max-lora-rank 16: one adapter is 83,886,080 bytes read and
    2 x 41,943,040 FLOPs per token (seed Example 15's rank-16 adapter)."""
    from fake_engines.factory import build_engine, parse_command
    from fake_engines.perf.batch import StepBatch
    from fake_engines.perf.catalogue import load_catalogue
    from fake_engines.perf.step_time import ACHIEVED_BANDWIDTH_SHARE

    plain = build_engine(parse_command(["fake-vllm", "serve", "llama-3.1-8b"]))
    served = build_engine(parse_command(["fake-vllm", "serve", "llama-3.1-8b", "--enable-lora", "--max-loras", "4"]))
    batch = StepBatch(decode_seqs=8, decode_context_tokens=8000)
    with_adapters = [StepBatch(decode_seqs=8, decode_context_tokens=8000, lora_adapters=k) for k in (1, 2, 4)]
    assert served.step_time(batch) == plain.step_time(batch)  # a step without adapters pays nothing
    assert all(plain.step_time(b) == plain.step_time(batch) for b in with_adapters)
    extra = [served.step_time(b) - served.step_time(batch) for b in with_adapters]
    per_adapter_s = 83_886_080 / (load_catalogue().gpu("h100").bandwidth_bytes_s * ACHIEVED_BANDWIDTH_SHARE)
    # the roofline's smooth max passes on most of a memory-bound step's added read time
    assert 0.5 * per_adapter_s < extra[0] <= per_adapter_s
    assert extra == sorted(extra) and extra[2] == pytest.approx(4 * extra[0], rel=0.05)
    decode_run = served.decode_run_time(with_adapters[0], 1, 3)
    assert list(decode_run) == [served.step_time(StepBatch(decode_seqs=8, decode_context_tokens=8000 + i,
                                                           lora_adapters=1)) for i in range(3)]
