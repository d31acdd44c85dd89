"""The proxy's token ids of a prompt are the look-alike vLLM's own, for every prompt shape."""

from __future__ import annotations

import pytest

from fake_engines.vllm.routes import _chat_prompt_ids, _completion_prompt_ids
from proxy.engine_tokens import engine_prompt_ids

CHATS = [
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there, é!"}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one "},
                                               {"type": "image_url", "image_url": {"url": "x"}},
                                               {"type": "text", "text": "part two"}]}]},
    {"messages": [{"role": "assistant", "content": None}, {"role": "user", "content": "go"}]},
]
COMPLETIONS = [{"prompt": "The quick brown fox " * 9}, {"prompt": [5, 6, 7, 8]},
               {"prompt": ["first prompt", "second"]}, {"prompt": [[1, 2, 3], [4]]}]


@pytest.mark.parametrize("body", CHATS)
def test_chat_ids_are_the_engines_template_and_tokenizer(body):
    assert engine_prompt_ids(body, chat=True) == tuple(_chat_prompt_ids(body)[0])


@pytest.mark.parametrize("body", COMPLETIONS)
def test_completion_ids_are_the_engines_first_prompt(body):
    assert engine_prompt_ids(body, chat=False) == tuple(_completion_prompt_ids(body)[0])


def test_no_prompt_gives_no_ids():
    assert engine_prompt_ids({"prompt": []}, chat=False) is None
    assert engine_prompt_ids({"messages": "nope"}, chat=True) is None
