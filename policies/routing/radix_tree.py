"""SGLang's approximate multi-tenant radix tree, as `sglang-cache-aware` uses it.

A port of sgl-model-gateway 0.3.2's `src/policies/tree.rs` (lightseekorg/smg at c7f9bf9, the
commit that released the `sglang-router` 0.3.2 wheel): one radix tree over request text shared by
all workers ("tenants"); every node records which tenants passed through it and when. Kept as
SGLang has it, because routing decisions depend on these details:
- A match walks the text as far as the tree goes (over any tenant), counting a partly matched
  node's shared part, and names one tenant of the deepest node reached: the tenant that created
  that node (SGLang caches it as `last_tenant`), or the node's first tenant once that one left.
- Time is a logical epoch, as in SGLang (`get_epoch`, a counter, no clock): a new leaf and the end
  of an insert take one, and so does every match, which stamps the tenant it names on 1 in 8.
- Eviction trims each tenant above `max_size` elements from its least recently stamped leaves.

Sequences are `str` (characters, as SGLang) or tuples of token ids (the simulator's prompts).
Differences: single-threaded (no locks or sharding); tenants of a node in insertion order where
SGLang iterates a hash map; a match on a node with no tenant stamps nothing (SGLang stamps a
tenant named "empty", which no worker is).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Text = Sequence[Any]
"""A `str` or a tuple of token ids: anything sliced, compared and indexed by position."""


@dataclass(eq=False)
class _Node:
    text: Text
    parent: _Node | None
    tenants: dict[str, int] = field(default_factory=dict)
    """Tenant -> epoch of its last access here; insertion-ordered."""
    children: dict[Any, _Node] = field(default_factory=dict)
    """First element of the child's text -> child."""
    last_tenant: str | None = None
    """The tenant that created the node; the one a match names while it is still here."""


@dataclass(frozen=True)
class Match:
    tenant: str | None
    """The tenant a match names; None when no tenant is known at all."""
    matched: int
    """Elements of the text found in the tree (any tenant), counting a partly matched node."""
    total: int
    """Elements in the text."""


def shared_prefix(a: Text, b: Text) -> int:
    """Length of the common prefix of `a` and `b` (compared in slices, not element by element)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low] and a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid
    return low


class RadixTree:
    """Which tenant probably caches which prefix; sizes counted per tenant in elements."""

    def __init__(self) -> None:
        self.root = _Node(text="", parent=None)
        self.tenant_size: dict[str, int] = {}
        self._epoch = itertools.count()

    def insert(self, text: Text, tenant: str) -> None:
        """Record that `tenant` now holds `text`: every node on its path gains the tenant."""
        self.root.tenants.setdefault(tenant, 0)
        self.tenant_size.setdefault(tenant, 0)
        remaining, prev = text, self.root
        while remaining:
            node = prev.children.get(remaining[0])
            if node is None:
                leaf = _Node(text=remaining, parent=prev, last_tenant=tenant)
                leaf.tenants[tenant] = next(self._epoch)
                self.tenant_size[tenant] += len(remaining)
                prev.children[remaining[0]] = leaf
                return
            shared = shared_prefix(remaining, node.text)
            if shared < len(node.text):
                node = self._split(prev, node, shared)
            if tenant not in node.tenants:  # an inner node: joined without a new stamp
                self.tenant_size[tenant] += len(node.text)
                node.tenants[tenant] = 0
            prev, remaining = node, remaining[shared:]
        prev.tenants[tenant] = next(self._epoch)

    def _split(self, parent: _Node, node: _Node, at: int) -> _Node:
        """Cut `node` after `at` elements; the new upper part keeps its tenants and creator."""
        upper = _Node(text=node.text[:at], parent=parent, tenants=dict(node.tenants),
                      last_tenant=node.last_tenant)
        node.text = node.text[at:]
        node.parent = upper
        upper.children[node.text[0]] = node
        parent.children[upper.text[0]] = upper
        return upper

    def prefix_match(self, text: Text) -> Match:
        """How much of `text` the tree holds, and the tenant of the deepest node reached."""
        remaining, matched, curr = text, 0, self.root
        while remaining:
            node = curr.children.get(remaining[0])
            if node is None:
                break
            shared = shared_prefix(remaining, node.text)
            matched += shared
            curr = node
            if shared < len(node.text):
                break
            remaining = remaining[shared:]
        tenant = curr.last_tenant
        if tenant is None or tenant not in curr.tenants:
            tenant = next(iter(curr.tenants), None)
            curr.last_tenant = tenant
        epoch = next(self._epoch)
        if epoch & 0x7 == 0 and tenant is not None:  # SGLang stamps 1 match in 8, to save contention
            curr.tenants[tenant] = epoch
        return Match(tenant, matched, len(text))

    def evict(self, max_size: int) -> None:
        """Trim every tenant holding more than `max_size` elements, least recent leaves first."""
        heap: list[tuple[int, int, str, _Node]] = []
        order = itertools.count()  # SGLang's heap breaks equal stamps arbitrarily; here by discovery
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for tenant in self._leaf_tenants(node):
                heap.append((node.tenants[tenant], next(order), tenant, node))
        heapq.heapify(heap)
        while heap:
            _, _, tenant, node = heapq.heappop(heap)
            if self.tenant_size.get(tenant, 0) <= max_size or not self._is_leaf_of(node, tenant):
                continue
            self.tenant_size[tenant] = max(0, self.tenant_size[tenant] - len(node.text))
            del node.tenants[tenant]
            parent = node.parent
            if parent is None:
                continue
            if not node.children and not node.tenants:
                parent.children.pop(node.text[0], None)
            if tenant in parent.tenants and self._is_leaf_of(parent, tenant):
                heapq.heappush(heap, (parent.tenants[tenant], next(order), tenant, parent))

    @staticmethod
    def _is_leaf_of(node: _Node, tenant: str) -> bool:
        return tenant in node.tenants and not any(tenant in c.tenants for c in node.children.values())

    @staticmethod
    def _leaf_tenants(node: _Node) -> list[str]:
        below = {t for c in node.children.values() for t in c.tenants}
        return [t for t in node.tenants if t not in below]
