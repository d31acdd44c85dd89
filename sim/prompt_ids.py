"""Prompt token ids of trace requests without building their text.

`loadgen.prompts.PromptBuilder` makes each block of a prompt from words drawn by
`random.Random(seed).choices`, one word per token. numpy's MT19937 is the same generator as
CPython's `random`, and `choices` maps each draw u to word floor(u * n), so the words, and
hence the token ids `encode(PromptBuilder().build(req, index))` gives, come out of one
vectorised draw per block. A test pins the equality.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from fake_engines.core import encode
from loadgen import prompts
from loadgen.trace import TraceRequest

_WORD_IDS = np.array([encode(word)[0] for word in prompts._VOCAB], dtype=np.int64)
"""Token id of each word of the builder's vocabulary (every word is exactly one token)."""


_STREAM = np.random.RandomState()


def _same_stream(seed: str) -> np.random.RandomState:
    """A numpy generator in the state `random.Random(seed)` starts in: CPython seeds from the
    string plus its SHA-512 as one integer, cut into 32-bit words for MT19937's init_by_array,
    which numpy's legacy seeding from a word array runs too."""
    text = seed.encode()
    whole = int.from_bytes(text + hashlib.sha512(text).digest(), "big")
    words = -(-whole.bit_length() // 32)
    _STREAM.seed(np.frombuffer(whole.to_bytes(4 * words, "little"), dtype=np.uint32))
    return _STREAM


def _draw_ids(seed: str, num_tokens: int) -> np.ndarray:
    """Token ids of `prompts.block_text`'s words for this seed (its `namespace:block_id`)."""
    draws = _same_stream(seed).random_sample(num_tokens)
    draws *= float(len(_WORD_IDS))
    return _WORD_IDS[draws.astype(np.int64)]  # truncation is floor: the draws are not negative


@functools.lru_cache(maxsize=8192)
def _block_ids(namespace: str, block_id: int, num_tokens: int) -> np.ndarray:
    # shared hash blocks recur across requests; per-request tails never do, so only blocks are kept
    return _draw_ids(f"{namespace}:{block_id}", num_tokens)


def prompt_token_ids(req: TraceRequest, index: int, namespace: str = "flotilla") -> list[int]:
    """`encode(PromptBuilder(namespace).build(req, index))`, computed without the text."""
    if req.prompt is not None:
        return encode(req.prompt)
    assert req.input_length is not None  # TraceRequest guarantees one of the two
    parts: list[np.ndarray] = []
    left = req.input_length
    for block_id in req.hash_ids:
        if left <= 0:
            break
        parts.append(_block_ids(namespace, block_id, req.block_tokens))
        left -= req.block_tokens
    missing = req.input_length - len(parts) * req.block_tokens
    if missing > 0:
        parts.append(_draw_ids(f"{namespace}/request:{index}", missing))
    if not parts:
        return []
    ids = parts[0] if len(parts) == 1 else np.concatenate(parts)
    prompt: list[int] = ids[:req.input_length].tolist()
    return prompt
