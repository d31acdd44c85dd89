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


@dataclass(frozen=True)
class Sampling:
    """How one request's tokens are drawn when the driver fixes it, as llama-server's sampler
    does: from a key (a function of the seed and the prompt, not of the request id, so the same
    prompt and seed give the same text whatever the slot, batch or stream), text planned in
    advance (a grammar's or schema's), and words a logit bias excludes."""

    key: str
    """Seeds the draws."""
    planned: tuple[int, ...] = ()
    """Tokens generated first, in order (constrained output); the driver ends the request after them."""
    words: tuple[int, ...] | None = None
    """Word token ids drawn from (what a logit bias leaves, `biased_words`); None: all of VOCAB_WORD_IDS."""


class PlannedStream:
    """A request's token source under a `Sampling`: its planned tokens, then seeded word draws
    from the words not banned."""

    def __init__(self, sampling: Sampling) -> None:
        self.rng = random.Random(sampling.key)
        self.planned = sampling.planned
        self.taken = 0
        self.words = sampling.words or VOCAB_WORD_IDS

    def take(self, count: int) -> list[int]:
        """The next `count` token ids."""
        out = list(self.planned[self.taken:self.taken + count])
        self.taken += len(out)
        if len(out) < count:
            out += _draw(self.rng, self.words, count - len(out))
        return out


BAN_BIAS = -30.0
"""A logit bias at or below this excludes a token in practice (llama-server's tests use -100 or false)."""
PREFER_BIAS = 30.0
"""A logit bias at or above this makes a token win over every unbiased one."""


def biased_words(biases: list[tuple[str, float]]) -> tuple[int, ...] | None:
    """The generator's words left by a logit bias given as (text, bias) pairs, each text a token's
    or a string's: a word is excluded when it is a whole word of a text biased at or below
    BAN_BIAS, and when some words are biased at or above PREFER_BIAS only those are drawn.
    None when the bias leaves the vocabulary as it is, or would leave no word at all."""
    banned = {w for text, bias in biases if bias <= BAN_BIAS for w in text.split()}
    preferred = {w for text, bias in biases if bias >= PREFER_BIAS for w in text.split()}
    words = tuple(i for i, w in zip(VOCAB_WORD_IDS, _WORDS, strict=True) if w.strip() not in banned)
    if preferred:
        words = tuple(i for i, w in zip(VOCAB_WORD_IDS, _WORDS, strict=True)
                      if w.strip() in preferred and i in words) or words
    return words if words and words != VOCAB_WORD_IDS else None


TokenSource = random.Random | PlannedStream
"""What a scheduler draws a request's tokens from."""


def token_stream(seed: int, request_id: str) -> random.Random:
    """The generator of one request's token ids: the same seed and request id give the same tokens."""
    return random.Random(f"{seed}/{request_id}")


def request_tokens(seed: int, request_id: str, sampling: Sampling | None) -> TokenSource:
    """A request's token source: its `Sampling` when the driver set one, else `token_stream`."""
    return token_stream(seed, request_id) if sampling is None else PlannedStream(sampling)


def next_token_id(stream: TokenSource) -> int:
    """Draw the next generated token id from a request's stream."""
    if isinstance(stream, PlannedStream):
        return stream.take(1)[0]
    return stream.choice(VOCAB_WORD_IDS)


def next_token_ids(stream: TokenSource, count: int) -> list[int]:
    """`count` draws of `next_token_id`, in one loop: `Random.choice` inlined (a draw of
    bit_length(n) bits, redrawn while out of range), so the stream advances identically."""
    if isinstance(stream, PlannedStream):
        return stream.take(count)
    return _draw(stream, VOCAB_WORD_IDS, count)


def _draw(stream: random.Random, words: tuple[int, ...], count: int) -> list[int]:
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
