"""Smoke test of bench.pd: a tiny slice of one trace, one link, two GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.pd.__main__ import main


def test_bench_pd_writes_its_table_json_and_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pd.json"
    assert main(["--requests", "0.02", "--gpus", "2", "--links", "ib400", "--traces", "azure-code",
                 "--json", str(out), "--plot", ""]) == 0
    captured = capsys.readouterr()
    assert "[2/2] azure-code P/D 1:1 ib400" in captured.err and "ETA" in captured.err
    assert "| azure-code (" in captured.out and "agrees with the simulator's on" in captured.out
    (case,) = json.loads(out.read_text())["cases"]
    assert case["requests"] == 12 and case["rows"]["ib400"]["plan_best"] == "1:1"
    assert set(case["rows"]["ib400"]["splits"]) == {"1:1"}
