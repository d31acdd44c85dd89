"""The workers' shared in-flight table (proxy/shared_load.py)."""

from __future__ import annotations

from pathlib import Path

from proxy.shared_load import SharedLoad


def test_shared_load_rows_add_up_and_a_dead_workers_row_is_zeroed(tmp_path: Path) -> None:
    load = SharedLoad(3, tmp_path / "slots.lock")
    a, b = load.slot_of("http://a"), load.slot_of("http://b")
    assert a != b and load.slot_of("http://a") == a
    for row, (requests, tokens) in enumerate([(2, 200), (3, 300), (5, 500)]):
        load.row = row
        load.publish(a, requests, tokens)
    load.row = 0
    assert load.peers(a) == (8, 800) and load.peers(b) == (0, 0)
    load.zero_row(2)
    assert load.peers(a) == (3, 300)
