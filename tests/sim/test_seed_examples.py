"""The seed lesson's Examples 9 and 16 reproduced by the simulator, through the CLI with --json.

tests/data/seed/example9.jsonl: the 12 requests, one every 100 ms, service_time_s = the
example's work in ms / 1000. tests/data/seed/example16.jsonl: 6 sessions x 5 turns, turn-major,
10 s apart so each finishes before the next; hash_ids of 200-token blocks: ids 0-9 are the
2,000-token system prompt, session s adds blocks 1000*(s+1)+k, 2400 or 600 tokens a turn.
"""

from __future__ import annotations

import json
from decimal import ROUND_HALF_UP, Decimal

import pytest

from flotilla.cli import main
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "seed"


def _ms(seconds: float, places: str = "0.1") -> str:
    """Milliseconds as the seed's Java prints them (%.1f rounds half up: 601.25 -> 601.3)."""
    return str(Decimal(repr(round(seconds * 1000, 6))).quantize(Decimal(places), ROUND_HALF_UP))


def _sim(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict]:
    assert main(["sim", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["runs"]


def test_example9_round_robin_and_least_outstanding(capsys: pytest.CaptureFixture[str]) -> None:
    runs = _sim(capsys, "--trace", str(DATA / "example9.jsonl"), "--engine", "fixed", "--replicas", "3",
                "--policy", "round-robin", "--policy", "least-outstanding")
    rr, lo = runs
    assert rr["meta"]["requests_per_replica"] == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
    assert _ms(rr["meta"]["e2e_mean_s"]) == "601.3"
    assert _ms(rr["meta"]["e2e_max_s"], "1") == "2450"
    assert lo["meta"]["requests_per_replica"] == [[0, 7, 9, 10], [1, 2, 3, 8, 11], [4, 5, 6]]
    assert _ms(lo["meta"]["e2e_mean_s"]) == "415.0"
    assert _ms(lo["meta"]["e2e_max_s"], "1") == "950"
    assert [r["backend"] for r in lo["requests"]] == ["0", "1", "1", "1", "2", "2", "2", "0", "1", "0", "0", "1"]


EXAMPLE16 = [
    ("round-robin", 72800, 95200, 56.7, [28400, 10400, 24200, 9800]),
    ("least-load:signal=prefill_tokens", 104000, 64000, 38.1, [25400, 24800, 30800, 23000]),
    ("session-affinity:home=modulo", 44000, 124000, 73.8, [26000, 8000, 5000, 5000]),
    ("session-affinity:home=modulo,signal=prefill_tokens,bound=1.25", 71000, 97000, 57.7,
     [21200, 17600, 15200, 17000]),
]


def test_example16_prefix_reuse_on_vllm_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    policies = [p for row in EXAMPLE16 for p in ("--policy", row[0])]
    runs = _sim(capsys, "--trace", str(DATA / "example16.jsonl"), "--engine", "vllm", "--replicas", "4",
                "--model", "llama-3.1-8b", "--gpu", "h100", "--block-size", "8",
                "--num-gpu-blocks-override", "100000", *policies)
    for run, (policy, computed, reused, hit_rate, work) in zip(runs, EXAMPLE16, strict=True):
        meta = run["meta"]
        assert meta["policy"] == policy.split(":")[0]
        assert meta["prompt_tokens_computed"] == computed, policy
        assert meta["prompt_tokens_reused"] == reused, policy
        assert round(100 * meta["hit_rate"], 1) == hit_rate, policy
        assert meta["prefill_tokens_per_replica"] == work, policy
        assert run["summary"]["num_ok"] == 30
