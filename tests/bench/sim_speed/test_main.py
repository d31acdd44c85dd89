"""`python -m bench.sim_speed` end to end on a small slice of the Azure sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sim_speed.__main__ import main


def test_small_run_reports_every_request_and_writes_json(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "speed.json"
    assert main(["--requests", "120", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["requests"] == 120 and result["replicas"] == 8
    assert result["engine_steps"] > result["events"] > 240  # decode runs: fewer events than steps
    assert result["requests_per_s"] == pytest.approx(120 / result["wall_s"])
    assert "goal (100,000 requests in < 60 s on one core): not met" in printed
