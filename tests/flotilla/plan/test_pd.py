"""`flotilla plan pd`: colocated against prefill:decode splits, predicted, then simulated."""

from __future__ import annotations

import json

import pytest

from flotilla.cli import main

ARGS = ["plan", "pd", "--model", "llama-3.1-8b", "--gpu", "h100", "--gpus", "4", "--input-len", "2048",
        "--output-len", "64", "--ttft-slo", "1", "--tpot-slo", "0.05"]


def test_plan_pd_ranks_every_split_and_a_slower_link_never_helps(capsys: pytest.CaptureFixture[str]) -> None:
    docs = {}
    for link in ("nvlink", "eth100"):
        assert main([*ARGS, "--link", link, "--check", "0", "--json"]) == 0
        docs[link] = json.loads(capsys.readouterr().out)
    fast, slow = docs["nvlink"], docs["eth100"]
    assert sorted((s["prefill"], s["decode"]) for s in fast["splits"]) == [(1, 3), (2, 2), (3, 1)]
    goodputs = [s["goodput_rps"] for s in fast["splits"]]
    assert goodputs == sorted(goodputs, reverse=True)  # best first
    # llama-3.1-8b, 2048 tokens x 131,072 bytes over 450 GB/s + 1 us (hand-computed)
    assert fast["replica"]["transfer_s"] == pytest.approx(1e-6 + 2048 * 131072 / 450e9)
    assert slow["replica"]["transfer_s"] > 10 * fast["replica"]["transfer_s"]
    assert slow["splits"][0]["goodput_rps"] <= fast["splits"][0]["goodput_rps"]
    assert fast["colocated_rps"] == slow["colocated_rps"] > 0  # no link in a colocated fleet


def test_plan_pd_is_checked_by_the_simulator(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--check", "2", "--check-requests", "40"]) == 0
    out = capsys.readouterr().out
    assert "colocated x4" in out and "best prefill:decode ratio" in out
    assert "checked by the simulator (40 requests" in out
    assert "best split: plan P/D" in out and ("(agree)" in out or "(disagree)" in out)


def test_plan_pd_refuses_a_budget_without_room_for_two_pools(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "pd", "--model", "llama-3.1-8b", "--gpu", "h100", "--gpus", "1"]) == 2
    assert "room for two replicas" in capsys.readouterr().err
