"""The served model's special tokens and llama-server's tokenizing of prompt values (server-common.cpp's
tokenize_mixed / tokenize_input_subprompt, build 0c1e570) over the look-alike's text tokenizer.

The look-alike's model is llama-family: its vocabulary adds a BOS (`<s>`, id 1, as /props names it)
when a caller asks for special tokens (embeddings, /tokenize with add_special) and no EOS.
"""

from __future__ import annotations

from fake_engines.core import decode, encode
from fake_engines.llamacpp.errors import LlamaError

BOS_ID = 1
"""Id of `<s>`, llama's BOS (the fake tokenizer's text ids also use 1, for a lone "\\n": decode reads it so)."""


def tokenize(text: str, add_special: bool) -> list[int]:
    """`text`'s ids, with BOS first when `add_special` (common_tokenize)."""
    return ([BOS_ID] if add_special else []) + encode(text)


def token_pieces(ids: list[int]) -> list[str]:
    """Each token's text; a BOS that starts the list is `<s>`."""
    return ["<s>" if i == 0 and t == BOS_ID else decode([t]) for i, t in enumerate(ids)]


def is_token_list(value: object) -> bool:
    """A JSON array of numbers only (json_is_array_of_numbers)."""
    return isinstance(value, list) and all(_is_number(v) for v in value)


def has_numbers(value: object) -> bool:
    """A JSON array holding at least one number (json_is_array_and_contains_numbers): one prompt, not a list of them."""
    return isinstance(value, list) and any(_is_number(v) for v in value)


def _is_mixed(value: object) -> bool:
    """An array holding both strings and numbers (json_is_array_of_mixed_numbers_strings)."""
    return isinstance(value, list) and any(isinstance(v, str) for v in value) and has_numbers(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def tokenize_mixed(value: object, add_special: bool) -> list[int]:
    """A string, or an array of token ids and strings (each string tokenized, BOS only before the
    first element), as one list of ids."""
    if isinstance(value, str):
        return tokenize(value, add_special)
    ids: list[int] = []
    for i, item in enumerate(value if isinstance(value, list) else []):
        if isinstance(item, str):
            ids += tokenize(item, add_special and i == 0)
        elif _is_number(item):
            ids.append(item)
    return ids


def tokenize_subprompt(value: object, add_special: bool) -> list[int]:
    """One prompt: a string, token ids, a mix of both, or {"prompt_string": ...}; llama-server's
    errors otherwise (a runtime_error there: 500)."""
    if isinstance(value, str) or _is_mixed(value):
        return tokenize_mixed(value, add_special)
    if isinstance(value, list) and is_token_list(value):
        return list(value)  # ids as given: no BOS added
    if isinstance(value, dict) and "prompt_string" in value:
        if "multimodal_data" in value:
            raise LlamaError(500, "Multimodal data provided, but model does not support multimodal requests.")
        return tokenize_mixed(value["prompt_string"], add_special)
    raise LlamaError(500, "\"prompt\" elements must be a string, a list of tokens, a JSON object containing a "
                          "prompt string, or a list of mixed strings & tokens.")


def tokenize_content(content: object, add_special: bool) -> list[int]:
    """/tokenize's `content`: a string or an array of ids and strings; another type fails as
    nlohmann's get<std::string> does (500)."""
    if not isinstance(content, str | list):
        kind = "null" if content is None else "boolean" if isinstance(content, bool) else \
            "object" if isinstance(content, dict) else "number"
        raise LlamaError(500, f"[json.exception.type_error.302] type must be string, but is {kind}")
    return tokenize_mixed(content, add_special)
