"""Per-replica engine configs: one source for the live servers and the simulated replicas."""

import pytest

from flotilla.testing.engines import llama_config, sim_replica_factory, vllm_config
from flotilla.testing.spec import FleetSpec, FleetSpecError


def test_every_vllm_replica_runs_the_groups_flags_with_the_fleet_seed_model_gpu_and_time_scale():
    spec = FleetSpec(engines=3, model="llama-3.1-8b", gpu="a100", time_scale=0.1, seed=7,
                     engine_options={"max_num_seqs": 4})
    configs = [vllm_config(spec, i) for i in range(3)]
    assert [c.seed for c in configs] == [7, 7, 7]  # as `flotilla up` starts a group's replicas
    c = configs[2]
    assert (c.model, c.model_name, c.gpu, c.time_scale, c.port, c.max_num_seqs) == (
        "llama-3.1-8b", "llama-3.1-8b", "a100", 0.1, 0, 4)
    assert c.enable_prompt_tokens_details and c.max_model_len is None  # the engine's default: the model's context
    assert spec.fleet().engines[0].replicas == 3


def test_llamacpp_serves_the_quantized_gguf_under_the_model_name():
    c = llama_config(FleetSpec(flavor="llamacpp", quant="Q8_0", engine_options={"n_parallel": 2}), 1)
    assert (c.model, c.model_id, c.n_parallel, c.metrics, c.seed, c.n_ctx) == (
        "llama-3.1-8b-Q8_0.gguf", "llama-3.1-8b", 2, True, 0, 65536)


def test_engine_options_must_be_engine_fields_and_not_fleet_settings():
    with pytest.raises(FleetSpecError) as err:
        vllm_config(FleetSpec(engine_options={"n_parallel": 2}), 0)
    assert err.value.field == "engine_options.n_parallel"
    with pytest.raises(FleetSpecError, match="fleet setting"):
        vllm_config(FleetSpec(engine_options={"gpu": "a100"}), 0)


def test_a_simulated_vllm_replica_has_the_live_engines_kv_blocks_and_batch_limits():
    from fake_engines.vllm.engine import size_engine

    spec = FleetSpec(engine_options={"max_num_seqs": 5, "num_gpu_blocks_override": 4000, "max_model_len": 8192})
    replica = sim_replica_factory(spec)(1, listener=None)
    sized = size_engine(vllm_config(spec, 1))
    cfg = replica.core.config
    assert (cfg.num_gpu_blocks, cfg.max_num_seqs, cfg.max_model_len) == (
        sized.num_gpu_blocks, 5, sized.max_model_len) == (4000, 5, 8192)
