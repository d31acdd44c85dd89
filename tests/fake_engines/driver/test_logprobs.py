"""The made-up token distribution: deterministic, plausible, sorted."""

from __future__ import annotations

import math

from fake_engines.core import encode
from fake_engines.driver.logprobs import (
    ALTERNATIVES,
    SAMPLED_BELOW_TOP_SHARE,
    prompt_key,
    request_logprobs,
    token_logprobs,
)


def test_every_alternative_is_one_token():
    assert all(len(encode(text)) == 1 for text in ALTERNATIVES) and len(set(ALTERNATIVES)) == len(ALTERNATIVES)


def test_entries_are_a_function_of_seed_prompt_position_and_token():
    prompt, tokens = encode("Hello world, the quick brown fox"), encode("jumps over the lazy dog")
    assert request_logprobs(1, prompt, 0, tokens, 5) == request_logprobs(1, prompt, 0, tokens, 5)
    assert request_logprobs(1, prompt, 0, tokens, 5) != request_logprobs(2, prompt, 0, tokens, 5)
    assert request_logprobs(1, prompt, 0, tokens, 5) != request_logprobs(1, encode("Other prompt"), 0, tokens, 5)
    assert request_logprobs(1, prompt, 0, tokens, 5)[1] == request_logprobs(1, prompt, 1, tokens[1:], 5)[0]


def test_greedy_tokens_are_the_most_likely_and_the_list_is_sorted_and_a_distribution():
    key = prompt_key(encode("a prompt"))
    for position in range(200):
        entry = token_logprobs(0, key, position, 4242, 20)
        values = [c.logprob for c in entry.top]
        assert entry.top[0] == entry.chosen and values == sorted(values, reverse=True) and len(set(values)) == 20
        assert all(v < 0 and math.isfinite(v) for v in values)
        assert sum(math.exp(v) for v in values) < 1.0
        assert len({c.token_id for c in entry.top}) == 20


def test_sampled_tokens_are_sometimes_not_the_most_likely():
    key = prompt_key(encode("a prompt"))
    below = sum(token_logprobs(0, key, p, 4242, 2, sampled=True).top[0].token_id != 4242 for p in range(2000))
    assert abs(below / 2000 - SAMPLED_BELOW_TOP_SHARE) < 0.03
