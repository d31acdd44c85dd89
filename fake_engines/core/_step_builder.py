"""Collects one step's scheduled work and turns it into a `ScheduledStep` with its `StepBatch`."""

from __future__ import annotations

from dataclasses import dataclass, field

from fake_engines.core._request import EngineRequest, ScheduledStep
from fake_engines.perf.batch import StepBatch


def is_decode(request: EngineRequest, num_new_tokens: int) -> bool:
    """True when the step computes just the request's last sampled token (one decode)."""
    return (
        num_new_tokens == 1
        and bool(request.output_token_ids)
        and request.num_computed_tokens == request.num_tokens - 1
    )


def decode_run_batch(requests: list[EngineRequest]) -> tuple[StepBatch, int]:
    """The first step's batch when every one of `requests` decodes one token (as `StepBuilder`
    counts a decode), and the context tokens each later step of the run adds."""
    adapters = len({r.lora for r in requests if r.lora is not None})
    batch = StepBatch(decode_seqs=len(requests), decode_context_tokens=sum(r.num_tokens for r in requests),
                      lora_adapters=adapters)
    return batch, len(requests)


@dataclass
class StepBuilder:
    """The step being scheduled; schedulers add requests to it in scheduling order."""

    token_budget: int
    """Tokens still allowed in this step."""
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    """request_id -> tokens scheduled, in scheduling order."""
    new_request_ids: list[str] = field(default_factory=list)
    """Requests scheduled for the first time."""
    resumed_request_ids: list[str] = field(default_factory=list)
    """Preempted requests scheduled again."""
    preempted_request_ids: list[str] = field(default_factory=list)
    """Requests preempted while building this step."""
    lora_adapters: set[str] = field(default_factory=set)
    """Distinct adapters of the scheduled requests."""
    prefill_tokens: int = 0
    """Prompt (or recompute) tokens scheduled."""
    prefill_attended_tokens: int = 0
    """Query-key pairs of the prefill chunks (see StepBatch)."""
    decode_seqs: int = 0
    """Requests decoding one token."""
    decode_context_tokens: int = 0
    """Sum of the decoding requests' context lengths."""
    _computed: dict[str, int] = field(default_factory=dict)
    """request_id -> tokens computed before this step, as `add` counted them."""
    _lora_requests: dict[str, list[str]] = field(default_factory=dict)
    """Adapter -> requests added with it (so `remove` knows when an adapter leaves the step)."""

    def add(self, request: EngineRequest, num_new_tokens: int, num_computed: int | None = None) -> None:
        """Schedule num_new_tokens of the request, which has num_computed_tokens already computed
        (or `num_computed`, counting steps in flight under async scheduling)."""
        if num_computed is None:
            computed = request.num_computed_tokens
            decode = is_decode(request, num_new_tokens)
        else:
            computed = num_computed
            decode = num_new_tokens == 1 and computed >= request.num_prompt_tokens
        self._computed[request.request_id] = computed
        if decode:
            self.decode_seqs += 1
            self.decode_context_tokens += computed + 1
        else:
            self.prefill_tokens += num_new_tokens
            self.prefill_attended_tokens += num_new_tokens * computed + num_new_tokens * (num_new_tokens + 1) // 2
        self.num_scheduled_tokens[request.request_id] = num_new_tokens
        self.token_budget -= num_new_tokens
        if request.lora is not None:
            self.lora_adapters.add(request.lora)
            self._lora_requests.setdefault(request.lora, []).append(request.request_id)

    def remove(self, request: EngineRequest) -> None:
        """Take back a request added to this step (vLLM's priority preemption of a request
        already scheduled); call before its progress changes."""
        num_new_tokens = self.num_scheduled_tokens.pop(request.request_id)
        computed = self._computed.pop(request.request_id)
        if num_new_tokens == 1 and computed >= request.num_prompt_tokens:
            self.decode_seqs -= 1
            self.decode_context_tokens -= computed + 1
        else:
            self.prefill_tokens -= num_new_tokens
            self.prefill_attended_tokens -= num_new_tokens * computed + num_new_tokens * (num_new_tokens + 1) // 2
        self.token_budget += num_new_tokens
        ids = self.num_scheduled_tokens
        self.lora_adapters = {r for r in self.lora_adapters if any(
            rid in ids for rid in self._lora_requests.get(r, ()))}

    def build(self, step_id: int) -> ScheduledStep:
        """Freeze the collected work into the step message."""
        batch = StepBatch(
            prefill_tokens=self.prefill_tokens,
            prefill_attended_tokens=self.prefill_attended_tokens,
            decode_seqs=self.decode_seqs,
            decode_context_tokens=self.decode_context_tokens,
            lora_adapters=len(self.lora_adapters),
        )
        return ScheduledStep(
            step_id=step_id,
            num_scheduled_tokens=dict(self.num_scheduled_tokens),
            batch=batch,
            new_request_ids=tuple(self.new_request_ids),
            resumed_request_ids=tuple(self.resumed_request_ids),
            preempted_request_ids=tuple(self.preempted_request_ids),
            lora_adapters=frozenset(self.lora_adapters),
        )
