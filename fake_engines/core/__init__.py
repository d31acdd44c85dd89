"""The clock-free engine core of the look-alike engines: schedulers, KV cache, tokenizer, generator.

Drivers (the asyncio live driver, the simulator) talk to an `EngineCore` only: `add_request`,
`abort_request`, `schedule` -> `ScheduledStep` (its `batch` goes to the perf model), `finish_step`
-> `RequestOutput`s, and `stats` -> `SchedulerStats`; a simulator may apply a stretch of identical
decode steps at once through the protocol's decode-run methods (`decode_run_length`,
`decode_run_batch`, `apply_decode_steps`, `kv_cache_usage_after`). `hash_block_tokens` is the
prefix-cache block hash, exported so a prefix-aware router can compute the same chain.
"""

from fake_engines.core._block_pool import HASH_ALGOS, NONE_HASH, hash_block_tokens
from fake_engines.core._config import ConfigError, LlamaCppSchedulerConfig, VllmSchedulerConfig
from fake_engines.core._generator import OutputLengthSampler, Sampling, next_token_id, token_stream
from fake_engines.core._llamacpp_scheduler import LlamaCppScheduler
from fake_engines.core._protocol import EngineCore
from fake_engines.core._request import (
    EngineRequest,
    FinishReason,
    RequestOutput,
    RequestRejected,
    RequestStatus,
    ScheduledStep,
    SchedulerStats,
    SlotState,
)
from fake_engines.core._tokenizer import CHARS_PER_TOKEN, VOCAB_SIZE, decode, encode
from fake_engines.core._vllm_scheduler import VllmScheduler

__all__ = [
    "CHARS_PER_TOKEN",
    "HASH_ALGOS",
    "NONE_HASH",
    "VOCAB_SIZE",
    "ConfigError",
    "EngineCore",
    "EngineRequest",
    "FinishReason",
    "LlamaCppScheduler",
    "LlamaCppSchedulerConfig",
    "OutputLengthSampler",
    "RequestOutput",
    "RequestRejected",
    "RequestStatus",
    "ScheduledStep",
    "Sampling",
    "SchedulerStats",
    "SlotState",
    "VllmScheduler",
    "VllmSchedulerConfig",
    "decode",
    "encode",
    "hash_block_tokens",
    "next_token_id",
    "token_stream",
]
