"""Counting fidelity items."""

from __future__ import annotations

from bench.fidelity.items import Item, summary


def test_summary_counts_each_verdict_per_kind_and_in_total():
    items = [Item("vllm", "a", "matched"), Item("vllm", "b", "differs", kind="metric"),
             Item("llama.cpp", "c", "missing", kind="metric"), Item("vllm", "d", "accepted", kind="sdk")]
    counts = summary(items)
    assert counts["metric"] == {"matched": 0, "accepted": 0, "differs": 1, "missing": 1}
    assert counts["total"] == {"matched": 1, "accepted": 1, "differs": 1, "missing": 1}
    assert sum(counts["error"].values()) == 0
