"""`fake-llama-server` flags map onto LlamaServerConfig as llama-server spells them."""

from __future__ import annotations

from fake_engines.llamacpp.cli import build_parser, config_from_args


def test_llama_server_flags_and_short_forms():
    args = build_parser().parse_args(["-m", "llama-3.1-8b-Q4_K_M.gguf", "-a", "m", "-c", "8192", "-np", "3", "-ngl",
                                      "20", "-sm", "row", "-ts", "3,1", "-mg", "1", "-b", "1024", "-ub", "256",
                                      "--lora", "a.gguf", "--lora-scaled", "b.gguf", "0.5", "--no-warmup", "--metrics",
                                      "--no-slots", "--slot-prompt-similarity", "0.5"])
    config = config_from_args(args)
    assert (config.model_id, config.n_ctx, config.n_parallel, config.n_gpu_layers) == ("m", 8192, 3, 20)
    assert (config.split_mode, config.tensor_split, config.main_gpu, config.num_gpus) == ("row", [3.0, 1.0], 1, 2)
    assert (config.n_batch, config.n_ubatch) == (1024, 256)
    assert config.loras == [("a.gguf", 1.0), ("b.gguf", 0.5)]
    assert not config.warmup and config.metrics and not config.slots and config.slot_prompt_similarity == 0.5
