"""Deterministic prompt text from hash ids, so equal ids give equal token blocks.

Traces such as Mooncake carry no text, only `hash_ids`: two requests share a KV prefix for
as many leading ids as they have in common. The builder turns each id into a text block of
exactly `block_tokens` tokens under the look-alike engines' tokenizer (a fixed number of
characters per token, prefix-stable), so replaying the trace produces real prefix-cache hits
downstream. Each block is made of ASCII words of CHARS_PER_TOKEN characters, so block
boundaries are token boundaries of `fake_engines.core.encode`.
"""

from __future__ import annotations

import functools
import random

from fake_engines.core import CHARS_PER_TOKEN
from loadgen.trace import TraceRequest

__all__ = ["CHARS_PER_TOKEN", "PromptBuilder", "block_text", "token_count"]

# three letters and a space: one word is one token, so no token straddles two blocks
_VOCAB = tuple(f"{a}{b}{c} " for a in "bdfgklmnprstvz" for b in "aeiou" for c in "bdglmnrstx")


def token_count(text: str) -> int:
    """Tokens the look-alike tokenizer gives `text`: ceil(chars / CHARS_PER_TOKEN)."""
    return -(-len(text) // CHARS_PER_TOKEN)


@functools.lru_cache(maxsize=8192)
def block_text(namespace: str, block_id: int, num_tokens: int) -> str:
    """Text of `num_tokens` tokens for one block id; a pure function of its arguments."""
    rng = random.Random(f"{namespace}:{block_id}")
    return "".join(rng.choices(_VOCAB, k=num_tokens))


class PromptBuilder:
    """Builds the prompt text of a `TraceRequest`."""

    def __init__(self, namespace: str = "flotilla") -> None:
        # the namespace keeps two traces whose ids were remapped from 0 from sharing text
        self.namespace = namespace

    def build(self, req: TraceRequest, index: int) -> str:
        """Prompt of `req`, the `index`-th request of its trace.

        With hash_ids, block i is `block_text(id_i)` cut to `input_length`; tokens past the
        last block (a trace inconsistency) and prompts without ids use text unique to `index`,
        so they never share a prefix by accident.
        """
        if req.prompt is not None:
            return req.prompt
        assert req.input_length is not None  # TraceRequest guarantees one of the two
        parts = self._blocks(req)
        have_tokens = sum(len(p) for p in parts) // CHARS_PER_TOKEN
        missing = req.input_length - have_tokens
        if missing > 0:
            parts.append(block_text(f"{self.namespace}/request", index, missing))
        return "".join(parts)[: req.input_length * CHARS_PER_TOKEN]

    def _blocks(self, req: TraceRequest) -> list[str]:
        assert req.input_length is not None
        parts: list[str] = []
        left = req.input_length
        for block_id in req.hash_ids:
            if left <= 0:
                break
            # a block is always built whole so its text does not depend on the prompt's length
            parts.append(block_text(self.namespace, block_id, req.block_tokens))
            left -= req.block_tokens
        return parts
