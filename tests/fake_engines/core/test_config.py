import pytest

from fake_engines.core import ConfigError, LlamaCppSchedulerConfig, VllmSchedulerConfig


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"num_gpu_blocks": 1}, "num_gpu_blocks"),
    ({"num_gpu_blocks": 100, "max_num_seqs": 0}, "max_num_seqs"),
    ({"num_gpu_blocks": 100, "long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
    ({"num_gpu_blocks": 10, "block_size": 16, "max_model_len": 161}, "num_gpu_blocks"),
])
def test_vllm_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        VllmSchedulerConfig(**kwargs)
    assert err.value.field == field


def test_vllm_max_model_len_defaults_to_what_the_usable_blocks_hold():
    assert VllmSchedulerConfig(num_gpu_blocks=11, block_size=16).max_model_len == 160
    assert VllmSchedulerConfig(num_gpu_blocks=10, block_size=16, max_model_len=160).max_model_len == 160


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"n_parallel": 0}, "n_parallel"),
    ({"slot_prompt_similarity": 1.5}, "slot_prompt_similarity"),
    ({"n_ctx": 0}, "n_ctx"),
])
def test_llamacpp_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        LlamaCppSchedulerConfig(**kwargs)
    assert err.value.field == field
