"""A deterministic, prefix-stable fake tokenizer: 4 characters per token.

Text is cut into fixed 4-character chunks from the start (the last chunk may be shorter), and
each chunk maps to one id, so the ratio is exactly CHARS_PER_TOKEN characters per token for text
of printable ASCII (plus tab, newline and carriage return). A chunk holding any other character is
split into one token per character. Because chunk boundaries depend only on character positions,
`encode(a + b)` starts with `encode(a)` whenever `len(a)` is a multiple of 4: two prompts that share
a long prefix share the token ids of that prefix, as real prefix caches need.

Ids are a bijection, so `decode(encode(text)) == text` for any text.
"""

from __future__ import annotations

import numpy as np

CHARS_PER_TOKEN = 4
"""Characters per token for ASCII text (the documented ratio)."""

_ALPHABET = "\t\n\r" + "".join(chr(c) for c in range(32, 127))
_INDEX = {ch: i for i, ch in enumerate(_ALPHABET)}
_BASE = len(_ALPHABET)  # 98 symbols
# Ids of ASCII chunks of length L start at _OFFSETS[L]; non-ASCII characters come after all of them.
_OFFSETS = [0, 0, _BASE, _BASE + _BASE**2, _BASE + _BASE**2 + _BASE**3]
_NON_ASCII_BASE = _OFFSETS[4] + _BASE**4

VOCAB_SIZE = _NON_ASCII_BASE + 0x110000
"""One more than the largest id `encode` can return."""


def _chunk_id(chunk: str) -> int:
    value = 0
    for ch in chunk:
        value = value * _BASE + _INDEX[ch]
    return _OFFSETS[len(chunk)] + value


def _chunk_text(token_id: int) -> str:
    length = max(n for n in range(1, 5) if _OFFSETS[n] <= token_id)
    value = token_id - _OFFSETS[length]
    chars = []
    for _ in range(length):
        value, digit = divmod(value, _BASE)
        chars.append(_ALPHABET[digit])
    return "".join(reversed(chars))


# alphabet index of each byte, -1 for bytes outside it: whole-text encoding in one numpy pass
_BYTE_INDEX = np.full(256, -1, dtype=np.int64)
_BYTE_INDEX[[ord(ch) for ch in _ALPHABET]] = np.arange(_BASE)
_VECTOR_MIN_CHARS = 64  # below this the plain loop is as quick


def encode(text: str) -> list[int]:
    """Token ids of `text`, one per 4-character chunk (see the module docstring)."""
    if len(text) >= _VECTOR_MIN_CHARS and text.isascii():
        index = _BYTE_INDEX[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
        if index.min() >= 0:
            return _encode_alphabet(text, index)
    return _encode_chunks(text)


def _encode_alphabet(text: str, index: np.ndarray) -> list[int]:
    """encode() of text made only of alphabet characters, given their indexes."""
    full = len(text) - len(text) % CHARS_PER_TOKEN
    digits = index[:full].reshape(-1, CHARS_PER_TOKEN)
    ids = ((digits[:, 0] * _BASE + digits[:, 1]) * _BASE + digits[:, 2]) * _BASE + digits[:, 3]
    out: list[int] = (ids + _OFFSETS[CHARS_PER_TOKEN]).tolist()
    if full < len(text):
        out.append(_chunk_id(text[full:]))
    return out


def _encode_chunks(text: str) -> list[int]:
    ids: list[int] = []
    for start in range(0, len(text), CHARS_PER_TOKEN):
        chunk = text[start:start + CHARS_PER_TOKEN]
        if all(ch in _INDEX for ch in chunk):
            ids.append(_chunk_id(chunk))
        else:
            ids.extend(_INDEX[ch] if ch in _INDEX else _NON_ASCII_BASE + ord(ch) for ch in chunk)
    return ids


def decode_token(token_id: int) -> str:
    """The text of one token id; raises ValueError for ids outside [0, VOCAB_SIZE)."""
    if not 0 <= token_id < VOCAB_SIZE:
        raise ValueError(f"token id {token_id} is outside [0, {VOCAB_SIZE})")
    if token_id >= _NON_ASCII_BASE:
        return chr(token_id - _NON_ASCII_BASE)
    return _chunk_text(token_id)


def decode(token_ids: list[int]) -> str:
    """The text of a sequence of token ids (the inverse of `encode`)."""
    return "".join(decode_token(t) for t in token_ids)
