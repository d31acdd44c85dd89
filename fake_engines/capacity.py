"""What a look-alike engine can do: the requests per second it sustains when full, modelled.

Routing weighs unlike replicas by their capacity (`BackendSpec.weight`). For a look-alike engine
the figure comes from the engine's own sizing and step-time model, read from the very command
line that starts it, so a fleet file's weights follow its models, GPUs, quantisations and
layouts without being written down.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fake_engines.factory import EngineConfig, LlamaServerConfig, VllmServeConfig, build_engine, parse_command
from fake_engines.factory.vllm_engine import VllmEngineSpec
from fake_engines.perf.batch import StepBatch
from fake_engines.perf.step_time import decode_batch, prefill_batch

REFERENCE_PROMPT_TOKENS = 512
"""Prompt of the reference request capacity is counted in (loadgen's default input)."""
REFERENCE_OUTPUT_TOKENS = 128
"""Output of the reference request (loadgen's default output)."""


def engine_config(argv: Sequence[str]) -> EngineConfig:
    """The config of the engine `argv` starts, read by that engine's own parser (the engine factory)."""
    return parse_command(argv)


def capacity_rps(config: EngineConfig, prompt_tokens: int = REFERENCE_PROMPT_TOKENS,
                 output_tokens: int = REFERENCE_OUTPUT_TOKENS) -> float:
    """Reference requests per second the engine completes with every sequence slot busy.

    As many requests as the engine runs at once (vLLM: max_num_seqs, or fewer if their KV cache
    does not fit; llama-server: its slots) are prefilled, then decoded at their mean context.
    It is a throughput figure: at a batch of one an RTX 4090 decodes about as fast as an H100,
    but the H100 runs hundreds of sequences where llama-server runs four."""
    if isinstance(config, VllmServeConfig):
        step, seqs, engines = _vllm(config, prompt_tokens + output_tokens)
    else:
        step, seqs, engines = _llama(config)
    prefill_s = step(prefill_batch(seqs, prompt_tokens))
    decode_s = step(decode_batch(seqs, prompt_tokens + output_tokens // 2))
    return engines * seqs / (prefill_s + output_tokens * decode_s)


def _vllm(config: VllmServeConfig, request_tokens: int) -> tuple[Callable[[StepBatch], float], int, int]:
    built = build_engine(config)
    assert isinstance(built.spec, VllmEngineSpec)
    fits = built.spec.num_gpu_blocks * config.resolved_block_size // request_tokens
    return built.step_time, max(1, min(built.spec.max_num_seqs, fits)), config.data_parallel_size


def _llama(config: LlamaServerConfig) -> tuple[Callable[[StepBatch], float], int, int]:
    from fake_engines.core import LlamaCppSchedulerConfig

    return build_engine(config).step_time, LlamaCppSchedulerConfig(n_parallel=config.n_parallel).num_slots, 1
