"""An approximate prefix-cache index: which prompt blocks each backend probably still caches.

Prompts are cut into fixed blocks and each block's hash is chained to the one before, as
vLLM's prefix cache does, so one hash names a whole prefix. A set of chained hashes per backend
is therefore a trie of blocks stored flat: a prompt matches as many leading blocks as are in
the set. Each backend's set is an LRU sized from its cache capacity.

Every insert is a whole chain from its first block, deepest blocks least recent, so a block is
never less recent than any block below it and eviction takes descendants before their
ancestors: each set is closed under prefixes. A prompt's blocks that are held are therefore
always its leading ones, which lets `match` find how many by bisection, and `insert` skip the
look-up of the leading blocks a match just counted.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from policies.routing.base import BackendView, RequestInfo
from policies.routing.hash_ring import stable_hash
from policies.routing.kv_index import block_keys


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
    name, so two models never share entries. The index lives in one process, where only
    equality matters, so the hashes are keyed at random per process (see `_TextKeys`). Token ids
    are linked one block at a time with Python's hash of (previous, block); text, every block of
    every routed prompt, in a few numpy passes (`_text_hashes`).
    """
    root = stable_hash(request.model or "")
    if not request.prompt_token_ids:
        return _text_hashes(request.prompt or "", shape.block_chars, root)
    # the same chain the KV index keys engine blocks by, rooted at the model instead of the adapter
    return block_keys(request.prompt_token_ids, shape.block_size_tokens, parent=root)


class _TextKeys:
    """Random 64-bit keys, drawn once per process, grown as longer prompts and blocks come.

    A block's hash is multilinear over its characters' code points, `sum(char_keys[j] * c[j])`
    mod 2**64; prefix k's hash is `sum(block_keys[i] * block[i] for i <= k)` mod 2**64, XOR
    `link_keys[k]` (prefixes of different lengths apart) and the model's seed. For two different
    prefixes of one length the chance of equal hashes is at most 2**-43 (code points are below
    2**21), whatever the text: no client can aim at a collision without the keys.
    """

    def __init__(self) -> None:
        self._rng = np.random.default_rng()
        self.chars = np.empty(0, dtype=np.uint64)
        self.blocks = np.empty(0, dtype=np.uint64)
        self.links = np.empty(0, dtype=np.uint64)

    def _grow(self, keys: np.ndarray, n: int) -> np.ndarray:
        if len(keys) >= n:
            return keys
        more = self._rng.integers(0, 2**64, size=max(n, 2 * len(keys)) - len(keys), dtype=np.uint64)
        return np.concatenate([keys, more])

    def ensure(self, block_chars: int, blocks: int) -> None:
        self.chars = self._grow(self.chars, block_chars)
        self.blocks = self._grow(self.blocks, blocks)
        self.links = self._grow(self.links, blocks)


_KEYS = _TextKeys()


def _code_points(text: str) -> np.ndarray:
    if text.isascii():
        return np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def _text_hashes(text: str, block_chars: int, seed: int) -> list[int]:
    """Chained hashes of the full `block_chars`-character blocks of `text` (see `_TextKeys`)."""
    n = len(text) // block_chars
    if n == 0:
        return []
    _KEYS.ensure(block_chars, n)
    chars = _code_points(text)[: n * block_chars].reshape(n, block_chars)
    with np.errstate(over="ignore"):  # arithmetic mod 2**64 is the point
        # quicker than @ for integers; einsum widens the 1- or 4-byte code points to uint64 a
        # buffer at a time, where a 64-bit copy of the whole prompt (3.2 MB for 400,000
        # characters) would be a fresh allocation to fault in on every request
        per_block = np.einsum("ij,j->i", chars, _KEYS.chars[:block_chars], dtype=np.uint64)
        chained = np.cumsum(per_block * _KEYS.blocks[:n], dtype=np.uint64)
    hashes: list[int] = (chained ^ _KEYS.links[:n] ^ np.uint64(seed)).tolist()
    return hashes


class PrefixIndex:
    """Per backend URL, an LRU of chained block hashes."""

    def __init__(self, default_capacity_blocks: int = 31_250) -> None:
        self.default_capacity_blocks = default_capacity_blocks
        self._lru: dict[str, OrderedDict[int, None]] = {}  # url -> hashes, least recent first

    def match(self, url: str, hashes: Sequence[int]) -> int:
        """How many leading blocks of `hashes` the backend at `url` holds.

        Held blocks are a prefix of the chain (see the module docstring), so the count is found
        by bisection: about 13 look-ups for a 400,000-character prompt instead of 6,250."""
        held = self._lru.get(url)
        if not held:
            return 0
        low, high = 0, len(hashes)  # hashes[:low] held; hashes[high:] not
        while low < high:
            mid = (low + high) // 2
            if hashes[mid] in held:
                low = mid + 1
            else:
                high = mid
        return low

    def insert(self, url: str, hashes: Sequence[int], capacity_blocks: int | None = None,
               held_blocks: int | None = None) -> None:
        """Record that `url` now caches `hashes`, evicting the least recently used beyond capacity.

        Deepest blocks go in first, so the first block is the most recent: eviction then trims
        prompts from the tail and a shorter prefix stays matchable, as in the engine's cache.
        `held_blocks` is `match(url, hashes)` when the caller knows it: the blocks past it are
        then new and go straight to the end, and only the held ones are moved.
        """
        held = self._lru.setdefault(url, OrderedDict())
        new_from = 0 if held_blocks is None else held_blocks
        # Add the new ones, then move the others to the end, deepest first: both loops run in C.
        deque(map(held.setdefault, reversed(hashes[new_from:])), maxlen=0)  # (OrderedDict.update is slower)
        moved = hashes if held_blocks is None else hashes[:held_blocks]
        deque(map(held.move_to_end, reversed(moved)), maxlen=0)
        limit = capacity_blocks if capacity_blocks is not None else self.default_capacity_blocks
        while len(held) > max(limit, 0):
            held.popitem(last=False)

    def size(self, url: str) -> int:
        return len(self._lru.get(url, ()))

    def clear(self) -> None:
        self._lru.clear()

    def record(self, backend: BackendView, hashes: Sequence[int], block_size_tokens: int,
               held_blocks: int | None = None) -> None:
        """Remember that `backend` now caches `hashes`; its LRU holds as many blocks as its
        scraped KV capacity, or the default while the engine has not reported one.
        `held_blocks`: `match(backend.url, hashes)`, when known (see `insert`)."""
        capacity = (self.default_capacity_blocks if backend.cache_capacity_tokens is None
                    else backend.cache_capacity_tokens // block_size_tokens)
        self.insert(backend.url, hashes, capacity, held_blocks)

    def match_fraction(self, url: str, hashes: Sequence[int]) -> float:
        """Share of `hashes` (a prompt's blocks) the index believes `url` holds; 0 for no blocks."""
        return self.match(url, hashes) / len(hashes) if hashes else 0.0
