"""`prompt` of /completion and /v1/completions as llama-server reads it (server-common.cpp
tokenize_input_prompts): one prompt (fake_engines.llamacpp.vocab.tokenize_subprompt: a string, ids,
a mix, {"prompt_string"}) or a list of them, one task each, BOS added before text as
`add_special` asks; and the vocabulary check a slot makes before it runs a prompt."""

from __future__ import annotations

from fake_engines.core import VOCAB_SIZE
from fake_engines.llamacpp import vocab
from fake_engines.llamacpp.errors import LlamaError


def tokenize_prompts(prompt: object) -> list[list[int]]:
    """Every task's prompt ids; a list holding no token id is a list of prompts. The completion
    routes answer what tokenizing refuses with 400 (handle_completions_impl catches it)."""
    try:
        items = prompt if isinstance(prompt, list) and not vocab.has_numbers(prompt) else [prompt]
        prompts = [vocab.tokenize_subprompt(p, add_special=True) for p in items]
    except LlamaError as exc:
        raise LlamaError(400, exc.message) from None
    if not prompts:
        raise LlamaError(400, "\"prompt\" must not be empty")
    for ids in prompts:
        check_vocabulary(ids)
    return prompts


def check_vocabulary(prompt: list[int]) -> None:
    """llama-server refuses a prompt holding an id outside the vocabulary."""
    if any(not 0 <= t < VOCAB_SIZE for t in prompt):
        raise LlamaError(400, "Prompt contains invalid tokens")
