"""Seeded generation: output lengths for requests and the readable tokens a request generates."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from fake_engines.core._config import ConfigError
from fake_engines.core._tokenizer import encode

# Every word is exactly one token (4 characters), so generated text decodes to readable words.
_WORDS = (
    "the ", "and ", "for ", "you ", "are ", "was ", "one ", "all ", "can ", "her ", "his ", "our ",
    "out ", "day ", "get ", "has ", "him ", "how ", "man ", "new ", "now ", "old ", "see ", "two ",
    "way ", "who ", "boy ", "did ", "its ", "let ", "put ", "say ", "she ", "too ", "use ", "sea ",
    "sun ", "sky ", "red ", "big ", "cat ", "dog ", "run ", "ran ", "sat ", "map ", "box ", "key ",
    "low ", "far ", "end ", "art ", "ice ", "oak ", "elm ", "fox ", "owl ", "bee ", "ant ", "hat ",
)
VOCAB_WORD_IDS: tuple[int, ...] = tuple(encode(w)[0] for w in _WORDS)
"""Token ids the generator draws from; each decodes to a 3-letter word and a space."""


def token_stream(seed: int, request_id: str) -> random.Random:
    """The generator of one request's token ids: the same seed and request id give the same tokens."""
    return random.Random(f"{seed}/{request_id}")


def next_token_id(stream: random.Random) -> int:
    """Draw the next generated token id from a request's stream."""
    return stream.choice(VOCAB_WORD_IDS)


def next_token_ids(stream: random.Random, count: int) -> list[int]:
    """`count` draws of `next_token_id`, in one loop: `Random.choice` inlined (a draw of
    bit_length(n) bits, redrawn while out of range), so the stream advances identically."""
    words = VOCAB_WORD_IDS
    n = len(words)
    bits = n.bit_length()
    getrandbits = stream.getrandbits
    out = []
    for _ in range(count):
        r = getrandbits(bits)
        while r >= n:
            r = getrandbits(bits)
        out.append(words[r])
    return out


@dataclass
class OutputLengthSampler:
    """Draws how many tokens a request generates before EOS, from a seeded geometric distribution."""

    seed: int = 0
    """Seed of the draw sequence."""
    mean_output_tokens: float = 128.0
    """Mean output length before EOS, in tokens (before the max_tokens cap)."""

    def __post_init__(self) -> None:
        if self.mean_output_tokens < 1:
            raise ConfigError("mean_output_tokens", self.mean_output_tokens, "must be >= 1")
        self._rng = random.Random(self.seed)

    def sample(self, max_tokens: int, ignore_eos: bool = False) -> int:
        """Tokens to generate: max_tokens when ignoring EOS, else a geometric draw (>= 1) capped by it."""
        if ignore_eos:
            return max_tokens
        p = 1.0 / self.mean_output_tokens
        u = self._rng.random()
        drawn = 1 if p >= 1.0 else 1 + int(math.log(1.0 - u) / math.log(1.0 - p))
        return min(drawn, max_tokens)
