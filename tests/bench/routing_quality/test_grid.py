"""The grid's pieces: policy discovery, the ideal hit rate, a cell's figures."""

from __future__ import annotations

from bench.routing_quality.grid import (
    FleetConfig,
    Workload,
    ideal_hit_rate,
    is_peer,
    policies,
    run_cell,
    workload,
)
from policies.routing.registry import available_policies


def test_every_registered_policy_is_in_the_grid_flotillas_first_then_the_peers() -> None:
    names = policies()
    assert sorted(names) == sorted(available_policies())
    families = [is_peer(n) for n in names]
    assert families == sorted(families)  # no Flotilla policy after a peer
    assert is_peer("sglang-cache-aware") and not is_peer("precise-prefix") and not is_peer("prefix-aware")


def test_ideal_hit_rate_counts_leading_blocks_seen_before_in_tokens(tmp_path) -> None:  # type: ignore[no-untyped-def]
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 1, "input_length": 1536, "output_length": 1, "hash_ids": [1, 2, 3]}\n'
                     '{"timestamp": 2, "input_length": 1024, "output_length": 1, "hash_ids": [9, 2]}\n'
                     '{"timestamp": 3, "input_length": 700, "output_length": 1, "hash_ids": [1, 2]}\n')
    # reused: 0, 1024 (blocks 1, 2), 0 (block 2 follows another parent), 700 (capped at the prompt)
    assert ideal_hit_rate(Workload("t", str(trace))) == (1024 + 700) / (1024 + 1536 + 1024 + 700)
    assert ideal_hit_rate(workload("azure-code"), max_requests=20) is None


def test_a_policy_that_fails_is_a_cell_with_its_error_not_the_end_of_the_grid() -> None:
    cell = run_cell(workload("agents"), "lora-affinity:no_such_field=1", FleetConfig(max_requests=5))
    assert cell.error is not None and "no_such_field" in cell.error and cell.requests == 0
