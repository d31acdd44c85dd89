"""A request's prompt token ids as the engine computes them, for lookups in the KV index.

The look-alike engines tokenize with `fake_engines.core.encode` and render chat messages with
`fake_engines.driver.chat.chat_prompt` (their ChatML template); this module calls those very
functions, so the ids, and therefore the blocks, are the engine's exactly. A prompt given as
token ids is taken as is, for any engine. For a real engine's own tokenizer the ids of a text
prompt differ, and its blocks match only prompts sent as token ids.
"""

from __future__ import annotations

from fake_engines.core import encode
from fake_engines.driver.chat import chat_prompt
from fake_engines.llamacpp.anthropic import to_chat_body


def engine_prompt_ids(body: dict, chat: bool) -> tuple[int, ...] | None:
    """The token ids of the (first) prompt of an already validated completions or chat body;
    None when there is no single prompt to take them from."""
    if chat:
        messages = body.get("messages")
        return tuple(encode(chat_prompt(messages))) if isinstance(messages, list) else None
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return tuple(encode(prompt))
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):
            return tuple(t for t in prompt if isinstance(t, int))
        if isinstance(first, str):  # vLLM serves each string as its own prompt: route on the first
            return tuple(encode(first))
        if isinstance(first, list):
            return tuple(t for t in first if isinstance(t, int))
    return None


def engine_anthropic_prompt_ids(body: dict) -> tuple[int, ...] | None:
    """The token ids of an already validated Anthropic Messages body, converted to chat messages as
    the look-alike llama-server converts it (system first, tool results as tool messages)."""
    return engine_prompt_ids(to_chat_body(body), chat=True)
