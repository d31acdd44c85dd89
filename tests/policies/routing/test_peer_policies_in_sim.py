"""The peers' algorithms run in the simulator, as every policy does: `flotilla sim --policy NAME`."""

from __future__ import annotations

import json

import pytest

from flotilla.cli import main
from tests.conftest import DATA

TRACE = DATA / "traces" / "mooncake_conversation.first60s.jsonl"


@pytest.mark.parametrize("policy", ["sglang-cache-aware", "llm-d", "dynamo-kv", "aibrix-prefix"])
def test_flotilla_sim_runs_the_peer_policy_on_a_mooncake_slice(policy: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["sim", "--trace", str(TRACE), "--replicas", "3", "--max-requests", "30", "--policy", policy,
                 "--json", "--no-progress"])
    assert code == 0
    (only,) = json.loads(capsys.readouterr().out)["runs"]
    assert only["meta"]["policy"] == policy
    assert len(only["requests"]) == 30
    assert sum(only["meta"]["decisions_by_rule"].values()) == 30
