"""`flotilla sim --kv-events-delay`: how late the engines' KV events reach a precise-prefix index."""

from __future__ import annotations

import json

import pytest

from flotilla.cli import main
from sim.fleet import KV_EVENTS_DELAY_S

AGENTS = "agents:sessions=6,turns=3,system=512,growth=256/128,output=8,think=1,stagger=0.1"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main(["sim", "--synthetic", AGENTS, "--replicas", "2", "--policy", "precise-prefix", "--json",
                 "--no-progress", *argv]) == 0
    meta: dict = json.loads(capsys.readouterr().out)["runs"][0]["meta"]  # type: ignore[type-arg]
    return meta


def test_precise_prefix_runs_on_the_engines_events_with_the_default_delay(capsys: pytest.CaptureFixture[str]) -> None:
    meta = _run(capsys)
    assert meta["kv_events_delay_s"] == KV_EVENTS_DELAY_S == 0.005
    assert meta["decisions_by_rule"].get("precise-match", 0) > 0
    assert meta["hit_rate"] > 0.3


def test_events_later_than_the_run_leave_the_policy_blind(capsys: pytest.CaptureFixture[str]) -> None:
    meta = _run(capsys, "--kv-events-delay", "100000")
    assert meta["kv_events_delay_s"] == 100000
    assert set(meta["decisions_by_rule"]) == {"least-load"}


@pytest.mark.parametrize("delay", ["-1", "nan", "inf"])
def test_a_negative_or_non_finite_delay_is_a_one_line_error(capsys: pytest.CaptureFixture[str], delay: str) -> None:
    assert main(["sim", "--synthetic", AGENTS, "--policy", "precise-prefix", "--kv-events-delay", delay,
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kv_events_delay_s must be a finite number >= 0" in err
    assert "Traceback" not in err
