"""`prompt` as llama-server reads it (server-common.cpp tokenize_input_prompts): a string, a list of
token ids, a list mixing ids and strings, a JSON object {"prompt_string", "multimodal_data"}, or a
list of any of those (one task each)."""

from __future__ import annotations

from fake_engines.core import VOCAB_SIZE, encode
from fake_engines.llamacpp.errors import LlamaError

ELEMENTS_ERROR = ("\"prompt\" elements must be a string, a list of tokens, a JSON object containing a prompt "
                  "string, or a list of mixed strings & tokens.")


def _is_token(item: object) -> bool:
    return isinstance(item, int) and not isinstance(item, bool)


def _one(prompt: object) -> list[int]:
    """One prompt's tokens (tokenize_input_subprompt); the look-alike's tokenizer adds no BOS."""
    if isinstance(prompt, str):
        return encode(prompt)
    if isinstance(prompt, list) and prompt and all(_is_token(p) or isinstance(p, str) for p in prompt):
        return [t for p in prompt for t in (encode(p) if isinstance(p, str) else [p])]
    if isinstance(prompt, dict) and "prompt_string" in prompt:
        if "multimodal_data" in prompt:
            raise LlamaError(400, "Multimodal data provided, but model does not support multimodal requests.")
        return _one(prompt["prompt_string"])
    raise LlamaError(400, ELEMENTS_ERROR)


def tokenize_prompts(prompt: object) -> list[list[int]]:
    """Every task's prompt tokens; a list holding no token id is a list of prompts."""
    if isinstance(prompt, list) and not any(_is_token(p) for p in prompt):
        prompts = [_one(p) for p in prompt]
    else:
        prompts = [_one(prompt)]
    if not prompts:
        raise LlamaError(400, "\"prompt\" must not be empty")
    return prompts


def check_vocabulary(prompt: list[int]) -> None:
    """llama-server refuses a prompt holding an id outside the vocabulary."""
    if any(not 0 <= t < VOCAB_SIZE for t in prompt):
        raise LlamaError(400, "Prompt contains invalid tokens")
