"""An approximate prefix-cache index: which prompt blocks each backend probably still caches.

Prompts are cut into fixed blocks and each block's hash is chained to the one before, as
vLLM's prefix cache does, so one hash names a whole prefix. A set of chained hashes per backend
is therefore a trie of blocks stored flat: a prompt matches as many leading blocks as are in
the set. Each backend's set is an LRU sized from its cache capacity.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from policies.routing.base import BackendView, RequestInfo
from policies.routing.hash_ring import stable_hash


@dataclass(frozen=True)
class BlockShape:
    """How prompts are cut into blocks."""

    block_size_tokens: int = 16
    """Tokens per block (vLLM's default KV block size)."""
    chars_per_token: int = 4
    """Characters per token when only text is known (a block is 64 characters by default)."""

    @property
    def block_chars(self) -> int:
        return self.block_size_tokens * self.chars_per_token


def block_hashes(request: RequestInfo, shape: BlockShape) -> list[int]:
    """Chained hashes of the request's full blocks, from the token ids if given, else the text.

    Only full blocks count, as only full blocks are cached. The chain starts from the model
    name, so two models never share entries. Each link is Python's hash of (previous, block):
    the index lives in one process, where only equality matters, and hashing a block in place
    costs a fraction of encoding it for a digest, for every block of every routed prompt.
    """
    previous = stable_hash(request.model or "")
    hashes: list[int] = []
    append = hashes.append
    for chunk in _chunks(request, shape):
        previous = hash((previous, chunk))
        append(previous)
    return hashes


def _chunks(request: RequestInfo, shape: BlockShape) -> list[tuple[int, ...]] | list[str]:
    if request.prompt_token_ids:
        ids, size = tuple(request.prompt_token_ids), shape.block_size_tokens
        return [ids[i : i + size] for i in range(0, len(ids) - size + 1, size)]
    text, size = request.prompt or "", shape.block_chars
    return [text[i : i + size] for i in range(0, len(text) - size + 1, size)]


class PrefixIndex:
    """Per backend URL, an LRU of chained block hashes."""

    def __init__(self, default_capacity_blocks: int = 31_250) -> None:
        self.default_capacity_blocks = default_capacity_blocks
        self._lru: dict[str, OrderedDict[int, None]] = {}  # url -> hashes, least recent first

    def match(self, url: str, hashes: Sequence[int]) -> int:
        """How many leading blocks of `hashes` the backend at `url` holds."""
        held = self._lru.get(url)
        if not held:
            return 0
        count = 0
        for h in hashes:
            if h not in held:
                break
            count += 1
        return count

    def insert(self, url: str, hashes: Sequence[int], capacity_blocks: int | None = None) -> None:
        """Record that `url` now caches `hashes`, evicting the least recently used beyond capacity.

        Deepest blocks go in first, so the first block is the most recent: eviction then trims
        prompts from the tail and a shorter prefix stays matchable, as in the engine's cache.
        """
        held = self._lru.setdefault(url, OrderedDict())
        for h in reversed(hashes):
            held[h] = None
            held.move_to_end(h)
        limit = capacity_blocks if capacity_blocks is not None else self.default_capacity_blocks
        while len(held) > max(limit, 0):
            held.popitem(last=False)

    def size(self, url: str) -> int:
        return len(self._lru.get(url, ()))

    def clear(self) -> None:
        self._lru.clear()

    def record(self, backend: BackendView, hashes: Sequence[int], block_size_tokens: int) -> None:
        """Remember that `backend` now caches `hashes`; its LRU holds as many blocks as its
        scraped KV capacity, or the default while the engine has not reported one."""
        capacity = (self.default_capacity_blocks if backend.cache_capacity_tokens is None
                    else backend.cache_capacity_tokens // block_size_tokens)
        self.insert(backend.url, hashes, capacity)

    def match_fraction(self, url: str, hashes: Sequence[int]) -> float:
        """Share of `hashes` (a prompt's blocks) the index believes `url` holds; 0 for no blocks."""
        return self.match(url, hashes) / len(hashes) if hashes else 0.0
