"""Requests as the engine core sees them, and the messages it hands back to its driver."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from fake_engines.core._generator import Sampling
from fake_engines.perf.batch import StepBatch


class RequestStatus(enum.Enum):
    """Where a request is in its life inside one engine core."""

    WAITING = "waiting"  # queued, never scheduled (vLLM waiting queue / llama.cpp deferred FIFO)
    PREEMPTED = "preempted"  # vLLM only: KV blocks taken back, back at the queue head, will recompute
    RUNNING = "running"  # holds KV blocks (vLLM) or a slot (llama.cpp) and is being computed
    FINISHED_STOPPED = "finished_stopped"  # generated its output_len tokens before max_tokens (EOS)
    FINISHED_LENGTH = "finished_length"  # hit max_tokens or the context limit
    FINISHED_ABORTED = "finished_aborted"  # the client went away; resources freed at once

    @property
    def is_finished(self) -> bool:
        """True once the request holds no resources and will never be scheduled again."""
        return self.value.startswith("finished")


class FinishReason(enum.Enum):
    """The OpenAI `finish_reason` a finished request reports."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class RequestRejected(ValueError):
    """The engine refuses the request outright (the HTTP layer answers 400).

    Raised by `add_request`; the fields carry what both engines put in their error bodies."""

    def __init__(self, message: str, n_prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(message)
        self.message = message
        self.n_prompt_tokens = n_prompt_tokens
        """Prompt length of the rejected request, in tokens."""
        self.n_ctx = n_ctx
        """The context limit it broke, in tokens (vLLM max_model_len, llama.cpp per-slot n_ctx)."""


@dataclass
class EngineRequest:
    """One generation request and its progress through the engine core.

    The driver fills the first block of fields; the core owns and mutates the progress fields."""

    request_id: str
    """Unique id within the engine; also seeds the request's generated token ids."""
    prompt_token_ids: list[int]
    """The tokenized prompt."""
    max_tokens: int
    """Upper bound on generated tokens (OpenAI max_tokens / llama.cpp n_predict)."""
    output_len: int
    """Tokens to generate before EOS; the driver draws it (seeded), or sets max_tokens for ignore_eos."""
    lora: str | None = None
    """LoRA adapter name (vLLM) or LoRA configuration key such as "0:1.0" (llama.cpp); None for the base model."""
    arrival_s: float = 0.0
    """Arrival time on the driver's clock, in seconds."""
    priority: int = 0
    """vLLM's request priority under `--scheduling-policy priority`: lower is served first
    (ties by arrival, then request id)."""
    id_slot: int = -1
    """llama.cpp: the slot the request asks for (`id_slot`; past the last one wraps around); -1: any."""
    sampling: Sampling | None = None
    """How its tokens are drawn (llama.cpp look-alike: seed and prompt, grammar, logit bias);
    None: from the engine seed and the request id."""
    kv_transfer_hold: bool = False
    """vLLM P/D, prefill side (kv_transfer_params do_remote_decode): once finished, its KV blocks
    stay allocated for a decode engine to pull, until `release_transfer_hold`."""
    remote_prefill: bool = False
    """vLLM P/D, decode side (do_remote_prefill): the prompt's KV beyond the local prefix-cache hit
    is loaded from a prefill engine, so only the last prompt token is computed here."""
    waiting_for_remote_kvs: bool = False
    """vLLM's WAITING_FOR_REMOTE_KVS: queued but not schedulable until the driver reports the
    pull done (`finish_remote_kv_load`)."""

    status: RequestStatus = RequestStatus.WAITING
    """Lifecycle state; see RequestStatus."""
    num_computed_tokens: int = 0
    """Tokens (prompt then output) whose KV is computed or reused from the cache."""
    num_cached_tokens: int | None = None
    """Prompt tokens served from the prefix cache at first scheduling; None until then."""
    slot_id: int = -1
    """llama.cpp: the slot that took the request; -1 until then."""
    output_token_ids: list[int] = field(default_factory=list)
    """Generated token ids so far."""
    num_preemptions: int = 0
    """Times this request was preempted (vLLM recompute)."""
    num_external_tokens: int = 0
    """Prompt tokens whose KV was loaded from a prefill engine (vLLM P/D), set at admission."""

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt length in tokens."""
        return len(self.prompt_token_ids)

    @property
    def is_prompt_only(self) -> bool:
        """max_tokens 0: a pooling task (embeddings, rerank) that computes its prompt and samples nothing."""
        return self.max_tokens == 0

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what the KV cache must eventually hold."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt followed by generated tokens."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def target_output_len(self) -> int:
        """Tokens this request will generate unless cut short: output_len capped by max_tokens."""
        return min(self.output_len, self.max_tokens)


@dataclass(frozen=True)
class ScheduledStep:
    """What one engine step computes; handed to the perf model, then back to `finish_step`."""

    step_id: int
    """Sequence number of the step within this engine core, from 0."""
    num_scheduled_tokens: dict[str, int]
    """request_id -> tokens computed for it in this step (1 for a decode, a chunk for a prefill)."""
    batch: StepBatch
    """The step's work in the perf model's terms."""
    new_request_ids: tuple[str, ...] = ()
    """Requests scheduled for the first time in this step (their queue wait ends now)."""
    resumed_request_ids: tuple[str, ...] = ()
    """Requests rescheduled after a preemption."""
    preempted_request_ids: tuple[str, ...] = ()
    """Requests preempted while building this step, newest first."""
    lora_adapters: frozenset[str] = frozenset()
    """Distinct LoRA adapters (or llama.cpp LoRA configurations) used by the step's requests."""


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request."""

    request_id: str
    """The request this output belongs to."""
    new_token_ids: tuple[int, ...]
    """Tokens generated in this step: one, or none for a prefill chunk that did not finish the prompt."""
    finished: bool
    """True when this is the request's last output."""
    finish_reason: FinishReason | None
    """Set only when finished."""
    num_prompt_tokens: int
    """Prompt length in tokens (for `usage.prompt_tokens`)."""
    num_output_tokens: int
    """Tokens generated so far, this step's included (for `usage.completion_tokens`)."""
    num_cached_tokens: int
    """Prompt tokens served from the prefix cache (for `usage.prompt_tokens_details.cached_tokens`)."""
    is_first_token: bool
    """True in the step that produced the request's first token (time to first token ends here)."""


@dataclass(frozen=True)
class SlotState:
    """One llama.cpp slot, as `/slots` shows it."""

    id: int
    """Slot index, from 0."""
    n_ctx: int
    """Context size of the slot, in tokens."""
    is_processing: bool
    """True while a request occupies the slot."""
    id_task: int
    """Task number of the current or last request, -1 if none yet."""
    request_id: str | None
    """The current or last request id."""
    n_prompt_tokens: int
    """Prompt length of the current or last request."""
    n_prompt_tokens_processed: int
    """Prompt tokens actually computed (not reused) for the current or last request."""
    n_prompt_tokens_cache: int
    """Prompt tokens reused from the slot's previous contents."""
    n_decoded: int
    """Tokens generated for the current or last request."""
    n_remain: int
    """Tokens left before max_tokens, -1 when idle."""
    lora: str | None
    """LoRA configuration key of the current or last request."""


@dataclass(frozen=True)
class SchedulerStats:
    """A snapshot of the engine core for gauges, counters and `/slots`. Counters are totals since start."""

    num_running: int
    """Requests holding KV blocks or a slot (vLLM num_requests_running, llama.cpp requests_processing)."""
    num_waiting: int
    """Queued requests, preempted included (vLLM num_requests_waiting, llama.cpp requests_deferred)."""
    kv_cache_usage: float
    """Fraction in [0, 1] of KV capacity referenced by live requests."""
    prefix_cache_queries: int = 0
    """Prompt tokens looked up in the prefix cache."""
    prefix_cache_hits: int = 0
    """Of those, tokens found in the cache (never more than queries)."""
    num_preemptions: int = 0
    """Preemptions so far."""
    prompt_tokens_total: int = 0
    """vLLM: prompt tokens of requests that produced a first token (as usage counts them).
    llama.cpp: prompt tokens actually processed (cached ones excluded)."""
    prompt_tokens_cached_total: int = 0
    """Prompt tokens reused from a cache instead of computed."""
    prompt_tokens_computed_total: int = 0
    """Prompt and recompute tokens actually run through the model."""
    generation_tokens_total: int = 0
    """Tokens generated so far (aborted requests' tokens included)."""
    num_steps: int = 0
    """Steps finished (llama.cpp n_decode_total)."""
    num_aborted: int = 0
    """Requests aborted so far."""
    running_lora_adapters: tuple[str, ...] = ()
    """Distinct adapters of running requests, sorted."""
    waiting_lora_adapters: tuple[str, ...] = ()
    """Distinct adapters of queued requests, sorted."""
    slots: tuple[SlotState, ...] = ()
    """llama.cpp slots in id order; empty for vLLM."""
    n_busy_slots_total: int = 0
    """llama.cpp: sum over steps of busy slots (n_busy_slots_per_decode = this / num_steps)."""
    n_tokens_max: int = 0
    """llama.cpp: the longest sequence seen (prompt + generated)."""
