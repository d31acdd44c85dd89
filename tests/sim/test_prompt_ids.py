"""Prompt ids drawn without text equal what the loadgen's prompt text encodes to."""

from __future__ import annotations

import random

from fake_engines.core import encode
from loadgen.prompts import PromptBuilder
from loadgen.trace import TraceRequest
from sim.prompt_ids import prompt_token_ids


def test_ids_equal_encoded_prompt_text_for_blocks_tails_and_literal_prompts() -> None:
    rng = random.Random(7)
    for namespace in ("flotilla", "other"):
        builder = PromptBuilder(namespace)
        for index in range(200):
            hash_ids = tuple(rng.randrange(40) for _ in range(rng.randint(0, 4)))
            req = TraceRequest(timestamp_s=0.0, output_length=1, input_length=rng.randint(0, 900),
                               hash_ids=hash_ids, block_tokens=rng.choice([1, 16, 200, 512]))
            assert prompt_token_ids(req, index, namespace) == encode(builder.build(req, index))
    literal = TraceRequest(timestamp_s=0.0, output_length=1, prompt="Say hi to the ocean, é!")
    assert prompt_token_ids(literal, 0) == encode("Say hi to the ocean, é!")


def test_requests_without_hash_ids_get_their_own_prompt() -> None:
    req = TraceRequest(timestamp_s=0.0, output_length=1, input_length=300)
    first, second = prompt_token_ids(req, 0), prompt_token_ids(req, 1)
    assert len(first) == len(second) == 300
    assert first[:16] != second[:16]
