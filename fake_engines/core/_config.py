"""Scheduler configurations: dataclasses with defaults and validation that names the field."""

from __future__ import annotations

from dataclasses import dataclass

from fake_engines.core._block_pool import HASH_ALGOS
from flotilla.errors import ConfigError as ConfigError  # re-exported: the engine core's error


def _require_positive(name: str, value: int) -> None:
    if value < 1:
        raise ConfigError(name, value, "must be >= 1")


@dataclass
class VllmSchedulerConfig:
    """vLLM V1 scheduler and KV-cache settings (the `vllm serve` flags of the same names)."""

    num_gpu_blocks: int
    """KV blocks on the GPU, from the capacity model or an override; block 0 is vLLM's null block."""
    max_model_len: int | None = None
    """Longest prompt + output a request may have, in tokens; None means what the KV cache holds."""
    max_num_seqs: int = 256
    """Most requests running at once."""
    max_num_batched_tokens: int = 8192
    """Token budget of one step, prefill chunks and decodes together."""
    block_size: int = 16
    """Tokens per KV block."""
    enable_prefix_caching: bool = True
    """Reuse full blocks across requests by hash."""
    prefix_caching_hash_algo: str = "sha256"
    """Block key: "sha256" (digests that agree across processes) or "builtin" (Python's tuple hash, faster)."""
    max_loras: int = 1
    """Most distinct LoRA adapters in one step (only when LoRA is used)."""
    long_prefill_token_threshold: int = 0
    """Largest prefill chunk per request per step; 0 means no cap beyond the budget."""
    scheduling_policy: str = "fcfs"
    """"fcfs", or "priority": the waiting queue ordered by (priority, arrival, request id), and
    the running request with the largest (priority, arrival) preempted first."""
    scheduler_reserve_full_isl: bool = True
    """Admit a request only when the cache can hold its whole input (less its cache hits), not
    only its first chunk (vLLM's `--scheduler-reserve-full-isl`, on by default)."""
    async_scheduling: bool = False
    """vLLM's `--async-scheduling`: the engine schedules step t before applying step t-1's
    output (two steps in flight), scheduling a request again while its previous token is
    still being computed (vLLM's AsyncScheduler and its output placeholders)."""
    max_concurrent_batches: int = 1
    """Steps in flight at once: the pipeline-parallel size."""
    seed: int = 0
    """Seeds the generated token ids (with each request id)."""
    enable_kv_cache_events: bool = False
    """Queue vLLM's KV cache events (BlockStored, BlockRemoved, AllBlocksCleared) for
    `take_kv_events`; off, the block pool builds none."""

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 2:
            raise ConfigError("num_gpu_blocks", self.num_gpu_blocks, "must be >= 2 (block 0 is reserved)")
        if self.max_model_len is None:
            self.max_model_len = (self.num_gpu_blocks - 1) * self.block_size
        for name in ("num_gpu_blocks", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                     "block_size", "max_loras", "max_concurrent_batches"):
            _require_positive(name, getattr(self, name))
        kv_tokens = self.num_gpu_blocks * self.block_size
        if kv_tokens < self.max_model_len:
            raise ConfigError("num_gpu_blocks", self.num_gpu_blocks,
                              f"the model's max seq len ({self.max_model_len}) is larger than the maximum "
                              f"number of tokens that can be stored in KV cache ({kv_tokens})")
        if self.prefix_caching_hash_algo not in HASH_ALGOS:
            raise ConfigError("prefix_caching_hash_algo", self.prefix_caching_hash_algo,
                              f"must be one of {', '.join(HASH_ALGOS)}")
        if self.async_scheduling and self.max_concurrent_batches > 1:
            raise ConfigError("async_scheduling", self.async_scheduling,
                              "async scheduling with pipeline parallelism is not modelled")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ConfigError("scheduling_policy", self.scheduling_policy, "must be one of fcfs, priority")
        if self.long_prefill_token_threshold < 0:
            raise ConfigError("long_prefill_token_threshold", self.long_prefill_token_threshold, "must be >= 0")


@dataclass
class LlamaCppSchedulerConfig:
    """llama-server slot and batching settings (-c, -np, -b, -ub, --slot-prompt-similarity)."""

    n_ctx: int = 4096
    """Total KV cells (-c), in tokens."""
    n_parallel: int = -1
    """Slots (-np); -1 is auto: 4 slots sharing one unified KV pool."""
    kv_unified: bool | None = None
    """One KV pool for all slots; None follows llama-server (unified only when -np is auto)."""
    n_ctx_train: int | None = None
    """The model's trained context; caps each slot's context. None means no cap."""
    slot_prompt_similarity: float = 0.10
    """Least common-prefix ratio for picking a slot by its cached prompt; 0 disables it."""
    n_batch: int = 2048
    """Logical batch size (-b): most tokens in one iteration."""
    n_ubatch: int = 512
    """Physical batch size (-ub)."""
    seed: int = 0
    """Seeds the generated token ids (with each request id)."""
    cache_ram_tokens: int = 0
    """Host-memory prompt cache (--cache-ram) in tokens of KV: a slot's cached prompt is saved
    there before a dissimilar prompt replaces it, and a later prompt loads the best match back;
    0 off, -1 no limit."""
    cache_idle_slots: bool = True
    """--cache-idle-slots (llama-server's default; needs the host cache): when a task takes a slot,
    every idle slot's prompt is saved to the host cache, and with a unified pool dropped from it."""

    def __post_init__(self) -> None:
        _require_positive("n_ctx", self.n_ctx)
        _require_positive("n_batch", self.n_batch)
        if self.cache_ram_tokens < -1:
            raise ConfigError("cache_ram_tokens", self.cache_ram_tokens, "must be >= 0, or -1 for no limit")
        _require_positive("n_ubatch", self.n_ubatch)
        if self.n_parallel == 0 or self.n_parallel < -1:
            raise ConfigError("n_parallel", self.n_parallel, "must be >= 1, or -1 for auto")
        if not 0.0 <= self.slot_prompt_similarity <= 1.0:
            raise ConfigError("slot_prompt_similarity", self.slot_prompt_similarity, "must be in [0, 1]")
        if self.n_ctx_train is not None:
            _require_positive("n_ctx_train", self.n_ctx_train)

    @property
    def num_slots(self) -> int:
        """Slots actually created: auto (-1) means 4."""
        return 4 if self.n_parallel == -1 else self.n_parallel

    @property
    def unified(self) -> bool:
        """Whether all slots share one pool of n_ctx cells."""
        return self.n_parallel == -1 if self.kv_unified is None else self.kv_unified

    @property
    def slot_n_ctx(self) -> int:
        """Context of one slot: the whole pool when unified, else an equal share; capped by training."""
        n_ctx = self.n_ctx if self.unified else self.n_ctx // self.num_slots
        return min(n_ctx, self.n_ctx_train) if self.n_ctx_train else n_ctx
