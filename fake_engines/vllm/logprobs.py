"""vLLM 0.32's logprobs objects (vllm/entrypoints/openai/{completion,chat_completion}/serving.py),
built from the made-up distribution of fake_engines.driver.logprobs.

Completions: {"text_offset", "token_logprobs", "tokens", "top_logprobs"}, each top_logprobs entry a
dict of the sampled token first, then the `logprobs` most likely tokens (one key per token, so
N or N+1 keys). Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [the first
`top_logprobs` of the same list]}]}. Echoed prompt tokens come first, the very first with null
logprob and null top_logprobs, as vLLM reports a prompt's first token.
"""

from __future__ import annotations

from collections.abc import Sequence

from fake_engines.driver.logprobs import Candidate, TokenLogprobs

MAX_LOGPROBS = 20
"""vLLM's default --max-logprobs."""


def _sampled_first(entry: TokenLogprobs, top_n: int) -> list[Candidate]:
    """vLLM's per-position dict: the sampled token, then the top ranks (each token once)."""
    return [entry.chosen] + [c for c in entry.top[:top_n] if c.token_id != entry.chosen.token_id]


def completion_logprobs(entries: Sequence[TokenLogprobs | None], tokens: Sequence[str], top_n: int,
                        first_offset: int = 0) -> dict:
    """A completion choice's logprobs; None entries (an echoed prompt's first token) get nulls."""
    offsets, at = [], first_offset
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {"text_offset": offsets,
            "token_logprobs": [e.chosen.logprob if e else None for e in entries],
            "tokens": list(tokens),
            "top_logprobs": [{c.text: c.logprob for c in _sampled_first(e, top_n)} if e else None
                             for e in entries]}


def chat_logprobs(entries: Sequence[TokenLogprobs], top_n: int) -> dict:
    """A chat choice's (or chunk's) logprobs."""
    return {"content": [{"token": e.chosen.text, "logprob": e.chosen.logprob, "bytes": e.chosen.utf8,
                         "top_logprobs": [{"token": c.text, "logprob": c.logprob, "bytes": c.utf8}
                                          for c in _sampled_first(e, top_n)[:top_n]]}
                        for e in entries]}


def prompt_logprobs(entries: Sequence[TokenLogprobs | None]) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: null for the first prompt token, then per token a map of token id
    to {logprob, rank, decoded_token}: the prompt's own token (its rank among the likeliest, 1 =
    most likely) and the requested number of likeliest tokens."""
    out: list[dict | None] = []
    for entry in entries:
        if entry is None:
            out.append(None)
            continue
        ranks = {c.token_id: r for r, c in enumerate(entry.top, start=1)}
        ranked = [entry.chosen] + [c for c in entry.top if c.token_id != entry.chosen.token_id]
        out.append({str(c.token_id): {"logprob": c.logprob, "rank": ranks.get(c.token_id, len(entry.top) + 1),
                                      "decoded_token": c.text} for c in ranked})
    return out
