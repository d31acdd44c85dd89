"""Log-probabilities of generated tokens, for clients that ask for them (logprobs, top_logprobs, n_probs).

The look-alikes sample no distribution, so one is made up, deterministically: a token's entry is a
function of the seed, the prompt, its position and the token itself, so the same request on the
same seed gets the same numbers. It is plausible: every value is a negative float, the
alternatives are sorted most likely first, and the chosen token is the most likely one unless the
request samples (temperature > 0), where now and then a less likely token is the one drawn, as a
sampler does. The engines' shapes (vLLM's, llama-server's) are built from these entries.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from fake_engines.core import decode, encode

ALTERNATIVES = (" the", " a", " of", " and", " to", " in", " is", " it", ".", ",", " I", " me", " for", " on",
                " you", " was", "ing", "ed", " be", " him", "'s", " he", " as", " at", " by", "\n", " we", " or",
                " an", " are", " not", " his", " one", " my", "er", "s", " so", " all", " new", " but")
"""Short, one-token strings the made-up alternatives are drawn from (each is one fake token)."""
_ALTERNATIVE_IDS = tuple(encode(text)[0] for text in ALTERNATIVES)
MAX_ALTERNATIVES = 20
"""vLLM's default --max-logprobs; llama-server caps n_probs far higher, but no client asks for more."""
SAMPLED_BELOW_TOP_SHARE = 0.15
"""Share of sampled (temperature > 0) tokens that were not the most likely one."""


@dataclass(frozen=True)
class Candidate:
    """One token and its log-probability."""

    token_id: int
    """Token id."""
    logprob: float
    """Natural log of its probability (negative)."""

    @property
    def text(self) -> str:
        """The token's text."""
        return decode([self.token_id])

    @property
    def utf8(self) -> list[int]:
        """The token's UTF-8 bytes (OpenAI's `bytes`)."""
        return list(self.text.encode("utf-8"))


@dataclass(frozen=True)
class TokenLogprobs:
    """The chosen token and the most likely tokens at its position."""

    chosen: Candidate
    """The token generated."""
    top: tuple[Candidate, ...]
    """The `top_n` most likely tokens, most likely first (the chosen one among them when it ranks)."""


def prompt_key(prompt_ids: Sequence[int]) -> bytes:
    """A digest of the prompt, computed once per request."""
    return hashlib.blake2b(struct.pack(f"<{len(prompt_ids)}q", *prompt_ids), digest_size=16).digest()


def _uniforms(seed: int, prompt: bytes, position: int, token_id: int, count: int) -> list[float]:
    digest = hashlib.blake2b(struct.pack("<qqq", seed, position, token_id) + prompt, digest_size=64).digest()
    words = struct.unpack("<16I", digest)
    return [(w + 0.5) / 2**32 for w in words[:count]]


def token_logprobs(seed: int, prompt: bytes, position: int, token_id: int, top_n: int,
                   sampled: bool = False) -> TokenLogprobs:
    """The entry of the token generated at `position` (0 = first output token) of a request whose
    prompt digests to `prompt` (prompt_key); `top_n` alternatives (at most MAX_ALTERNATIVES)."""
    u = _uniforms(seed, prompt, position, token_id, 4 + MAX_ALTERNATIVES)
    p_top = 0.30 + 0.65 * u[0]  # the most likely token's probability
    below = sampled and u[1] < SAMPLED_BELOW_TOP_SHARE
    # the rest shrinks geometrically, each draw keeping the list strictly decreasing
    probs, rest = [p_top], 1.0 - p_top
    for k in range(MAX_ALTERNATIVES + 1):
        share = rest * (0.35 + 0.4 * u[(4 + k) % len(u)])
        probs.append(min(share, probs[-1] * 0.999))
        rest -= share
    rank = 1 if below else 0
    chosen = Candidate(token_id, math.log(probs[rank]))
    others = _alternative_ids(u[2], u[3], token_id, MAX_ALTERNATIVES + 1)
    ranked, other = [], iter(others)
    for r, p in enumerate(probs[:max(top_n, rank + 1)]):
        ranked.append(chosen if r == rank else Candidate(next(other), math.log(p)))
    return TokenLogprobs(chosen, tuple(ranked[:top_n]))


def _alternative_ids(u_start: float, u_step: float, exclude: int, count: int) -> list[int]:
    n = len(_ALTERNATIVE_IDS)
    start, step = int(u_start * n), 1 + 2 * int(u_step * (n // 2 - 1))  # an odd step visits them all when n is even
    step = step if math.gcd(step, n) == 1 else 1
    ids = [_ALTERNATIVE_IDS[(start + i * step) % n] for i in range(n)]
    return [i for i in ids if i != exclude][:count]


def request_logprobs(seed: int, prompt_ids: Sequence[int], first_position: int, token_ids: Sequence[int],
                     top_n: int, sampled: bool = False) -> list[TokenLogprobs]:
    """Entries of consecutive tokens, the first at `first_position` of the output."""
    key = prompt_key(prompt_ids)
    return [token_logprobs(seed, key, first_position + i, t, top_n, sampled) for i, t in enumerate(token_ids)]
