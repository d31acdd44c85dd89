"""llama-server slots: what each remembers of its last prompt, and how a request picks one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fake_engines.core._request import EngineRequest, SlotState


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class Slot:
    """One llama.cpp slot: a sequence position in the KV cache, busy with at most one request."""

    id: int
    """Slot index, from 0."""
    n_ctx: int
    """Context of this slot, in tokens."""
    request: EngineRequest | None = None
    """The request being processed; None when idle."""
    cache_tokens: list[int] = field(default_factory=list)
    """Tokens whose KV the slot holds from its previous request (reused by a similar next prompt)."""
    cache_lora: str | None = None
    """LoRA configuration those tokens were computed under."""
    t_last_used: int = -1
    """Logical time of the last release; the least recently used idle slot has the smallest."""
    id_task: int = -1
    """Task number of the current or last request."""
    last_request_id: str | None = None
    """Id of the current or last request."""
    last_n_prompt_tokens: int = 0
    """Prompt length of the current or last request."""
    n_prompt_tokens_cache: int = 0
    """Prompt tokens of the current request reused from cache_tokens."""

    @property
    def is_processing(self) -> bool:
        """True while a request occupies the slot."""
        return self.request is not None

    @property
    def used_cells(self) -> int:
        """KV cells the slot holds: its request's prompt (reserved at launch) and output, or its cache."""
        if self.request is None:
            return len(self.cache_tokens)
        return max(self.request.num_prompt_tokens, self.request.num_computed_tokens)

    def state(self) -> SlotState:
        """The slot as `/slots` shows it."""
        req = self.request
        return SlotState(
            id=self.id,
            n_ctx=self.n_ctx,
            is_processing=req is not None,
            id_task=self.id_task,
            request_id=self.last_request_id,
            n_prompt_tokens=self.last_n_prompt_tokens,
            n_prompt_tokens_processed=0 if req is None else req.num_prompt_tokens - self.n_prompt_tokens_cache,
            n_prompt_tokens_cache=0 if req is None else self.n_prompt_tokens_cache,
            n_decoded=0 if req is None else len(req.output_token_ids),
            n_remain=-1 if req is None else req.max_tokens - len(req.output_token_ids),
            lora=self.cache_lora if req is None else req.lora,
        )


def select_slot(slots: Sequence[Slot], prompt: Sequence[int], similarity: float) -> Slot | None:
    """The idle slot a new request takes, as llama-server's get_available_slot picks it.

    First the idle slot whose cached tokens share the longest prefix with the prompt, if that
    prefix is more than `similarity` of the prompt (the first such slot on ties); otherwise the
    least recently used idle slot."""
    idle = [s for s in slots if not s.is_processing]
    if not idle:
        return None
    best, best_sim = None, similarity
    if similarity > 0.0 and prompt:
        for slot in idle:
            sim = common_prefix_len(slot.cache_tokens, prompt) / len(prompt)
            if sim > best_sim:
                best, best_sim = slot, sim
    if best is not None:
        return best
    # Ties go to the highest id: a fresh llama-server with -np 2 serves its first request on slot 1.
    return min(idle, key=lambda s: (s.t_last_used, -s.id))
