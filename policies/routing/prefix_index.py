"""An approximate prefix-cache index: which prompt blocks each backend probably still caches.

Prompts are cut into fixed blocks and each block's hash is chained to the one before, as
vLLM's prefix cache does, so one hash names a whole prefix: a prompt matches as many leading
blocks as the backend holds. Each backend's blocks are an LRU sized from its cache capacity.

Every insert is a whole chain from its first block, deepest blocks least recent, so a block is
never less recent than any block below it and eviction takes descendants before their
ancestors: what a backend holds is closed under prefixes. It is kept as a radix tree whose nodes
are runs of blocks that one insert touched last (`_Tree`): a match or an insert walks a few nodes
and compares each run in one go, whatever the prompt's length."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

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

    A block's hash is multilinear over its units, `sum(unit_keys[j] * u[j])` mod 2**64, where
    the units are an ASCII block's bytes four at a time (32-bit words, with `words` keys), or
    else its characters' code points (with `chars` keys); prefix k's hash is
    `sum(block_keys[i] * block[i] for i <= k)` mod 2**64, XOR `link_keys[k]` (prefixes of
    different lengths apart) and the model's seed. Units are below 2**32, so for two different
    prefixes of one length the chance of equal hashes is at most 2**-32, whatever the text: no
    client can aim at a collision without the keys.
    """

    def __init__(self) -> None:
        self._rng = np.random.default_rng()
        self.chars = np.empty(0, dtype=np.uint64)
        self.words = np.empty(0, dtype=np.uint64)
        self.blocks = np.empty(0, dtype=np.uint64)
        self.links = np.empty(0, dtype=np.uint64)

    def _grow(self, keys: np.ndarray, n: int) -> np.ndarray:
        if len(keys) >= n:
            return keys
        more = self._rng.integers(0, 2**64, size=max(n, 2 * len(keys)) - len(keys), dtype=np.uint64)
        return np.concatenate([keys, more])

    def ensure(self, block_chars: int, blocks: int) -> None:
        self.chars = self._grow(self.chars, block_chars)
        self.words = self._grow(self.words, block_chars // 4)
        self.blocks = self._grow(self.blocks, blocks)
        self.links = self._grow(self.links, blocks)


_KEYS = _TextKeys()


def _units(text: str, blocks: int, block_chars: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `blocks` blocks of `text` as rows of hash units, and the keys for them."""
    if text.isascii() and block_chars % 4 == 0:  # a quarter of the multiplications
        words = np.frombuffer(text.encode("ascii"), dtype=np.uint32, count=blocks * block_chars // 4)
        return words.reshape(blocks, block_chars // 4), _KEYS.words[:block_chars // 4]
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32, count=blocks * block_chars)
    return points.reshape(blocks, block_chars), _KEYS.chars[:block_chars]


def _text_hashes(text: str, block_chars: int, seed: int) -> list[int]:
    """Chained hashes of the full `block_chars`-character blocks of `text` (see `_TextKeys`)."""
    n = len(text) // block_chars
    if n == 0:
        return []
    _KEYS.ensure(block_chars, n)
    units, keys = _units(text, n, block_chars)
    with np.errstate(over="ignore"):  # arithmetic mod 2**64 is the point
        # einsum widens the 32-bit units to uint64 a buffer at a time, where a 64-bit copy of
        # the whole prompt (800 KB for 400,000 ASCII characters) would be one more allocation
        per_block = np.einsum("ij,j->i", units, keys, dtype=np.uint64)
        chained = np.cumsum(per_block * _KEYS.blocks[:n], dtype=np.uint64)
    hashes: list[int] = (chained ^ _KEYS.links[:n] ^ np.uint64(seed)).tolist()
    return hashes


@dataclass(eq=False)
class _Run:
    """A node of a backend's tree: consecutive blocks that the same insert touched last."""

    hashes: list[int]
    parent: _Run | None
    stamp: int
    """The insert that touched these blocks last (larger is more recent)."""
    children: dict[int, _Run] = field(default_factory=dict)
    """First hash of each child's run -> the child."""


def _common(run: list[int], hashes: list[int], at: int) -> int:
    """How many leading blocks of `run` equal `hashes[at:]`'s. A chained hash names its whole
    prefix, so two chains agree on a prefix of blocks or not at all: one look at the run's last
    block, else bisection, finds it."""
    low, high = 0, min(len(run), len(hashes) - at)
    if high == len(run) and run[-1] == hashes[at + high - 1]:
        return high
    while low < high:
        mid = (low + high) // 2
        if run[mid] == hashes[at + mid]:
            low = mid + 1
        else:
            high = mid
    return low


class _Tree:
    """One backend's blocks: a radix tree of runs, an LRU over blocks in recency order."""

    def __init__(self) -> None:
        self.root = _Run([], None, 0)
        self.blocks = 0
        self.nodes = 0
        self.inserts = 0
        self.leaves: list[tuple[int, int, _Run]] = []
        """A heap of (stamp, tie, leaf); an entry is stale once its leaf was touched, grew a
        child or went (checked when popped)."""
        self._tie = itertools.count()

    def match(self, hashes: list[int]) -> int:
        node, at = self.root, 0
        while at < len(hashes):
            child = node.children.get(hashes[at])
            if child is None:
                break
            common = _common(child.hashes, hashes, at)
            at += common
            if common < len(child.hashes):
                break
            node = child
        return at

    def insert(self, hashes: list[int]) -> None:
        """Touch every block of `hashes` (a chain from its first block), adding the new ones."""
        self.inserts += 1
        stamp = self.inserts
        node, at = self.root, 0
        while at < len(hashes):
            child = node.children.get(hashes[at])
            if child is None:
                leaf = _Run(list(hashes[at:]), node, stamp)
                node.children[hashes[at]] = leaf
                self.blocks += len(leaf.hashes)
                self.nodes += 1
                self._push(leaf)
                return
            common = _common(child.hashes, hashes, at)
            if common < len(child.hashes):
                self._split(child, common)
            child.stamp = stamp
            at += common
            node = child
        if not node.children and node is not self.root:
            self._push(node)  # the chain ended at a leaf: its entry moves up

    def _split(self, run: _Run, keep: int) -> None:
        """Cut `run` after `keep` blocks; the tail keeps its stamp and the run's children."""
        tail = _Run(run.hashes[keep:], run, run.stamp, run.children)
        del run.hashes[keep:]
        run.children = {tail.hashes[0]: tail}
        for child in tail.children.values():
            child.parent = tail
        self.nodes += 1
        if not tail.children:
            self._push(tail)

    def _push(self, leaf: _Run) -> None:
        if len(self.leaves) > 4 * self.nodes + 64:  # mostly stale: rebuild from the live leaves
            self.leaves = [e for e in self.leaves if self._live(e)]
            heapq.heapify(self.leaves)
        heapq.heappush(self.leaves, (leaf.stamp, next(self._tie), leaf))

    @staticmethod
    def _live(entry: tuple[int, int, _Run]) -> bool:
        stamp, _, leaf = entry
        return leaf.parent is not None and not leaf.children and leaf.stamp == stamp

    def evict(self, limit: int) -> None:
        """Drop blocks, least recent first, until at most `limit` are left: the deepest blocks
        of the least recently touched leaf go first, so what stays is closed under prefixes."""
        while self.blocks > limit:
            entry = heapq.heappop(self.leaves)
            if not self._live(entry):
                continue
            leaf = entry[2]
            excess = self.blocks - limit
            if excess < len(leaf.hashes):
                del leaf.hashes[len(leaf.hashes) - excess:]
                self.blocks -= excess
                heapq.heappush(self.leaves, entry)
                return
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.hashes[0]]
            leaf.parent = None
            self.blocks -= len(leaf.hashes)
            self.nodes -= 1
            if not parent.children and parent is not self.root:
                self._push(parent)


def _as_list(hashes: Sequence[int]) -> list[int]:
    return hashes if isinstance(hashes, list) else list(hashes)  # runs compare as lists


class PrefixIndex:
    """Per backend URL, an LRU of chained block hashes, kept as a radix tree of runs.

    Recency is per block, as in a flat LRU: an insert touches the whole chain, deepest blocks
    least recent. Consecutive blocks one insert touched last form one node, so touching a long
    prompt again costs a few node updates and a list comparison in C rather than one LRU move
    per block (6,250 for a 400,000-character prompt)."""

    def __init__(self, default_capacity_blocks: int = 31_250) -> None:
        self.default_capacity_blocks = default_capacity_blocks
        self._trees: dict[str, _Tree] = {}

    def match(self, url: str, hashes: Sequence[int]) -> int:
        """How many leading blocks of `hashes` the backend at `url` holds."""
        tree = self._trees.get(url)
        return tree.match(_as_list(hashes)) if tree is not None else 0

    def insert(self, url: str, hashes: Sequence[int], capacity_blocks: int | None = None) -> None:
        """Record that `url` now caches `hashes`, evicting the least recently used beyond capacity.

        The first block ends up the most recent and the last the least, so eviction trims
        prompts from the tail and a shorter prefix stays matchable, as in the engine's cache."""
        tree = self._trees.get(url)
        if tree is None:
            tree = self._trees[url] = _Tree()
        tree.insert(_as_list(hashes))
        limit = capacity_blocks if capacity_blocks is not None else self.default_capacity_blocks
        tree.evict(max(limit, 0))

    def size(self, url: str) -> int:
        tree = self._trees.get(url)
        return tree.blocks if tree is not None else 0

    def clear(self) -> None:
        self._trees.clear()

    def record(self, backend: BackendView, hashes: Sequence[int], block_size_tokens: int) -> None:
        """Remember that `backend` now caches `hashes`; its LRU holds as many blocks as its
        scraped KV capacity, or the default while the engine has not reported one."""
        capacity = (self.default_capacity_blocks if backend.cache_capacity_tokens is None
                    else backend.cache_capacity_tokens // block_size_tokens)
        self.insert(backend.url, hashes, capacity)

    def match_fraction(self, url: str, hashes: Sequence[int]) -> float:
        """Share of `hashes` (a prompt's blocks) the index believes `url` holds; 0 for no blocks."""
        return self.match(url, hashes) / len(hashes) if hashes else 0.0
