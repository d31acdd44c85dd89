"""Smoke test of bench.pd: a tiny slice of one trace, two GPU budgets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.pd.__main__ import main


def test_bench_pd_runs_each_budget_sweeping_links_at_the_smallest(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pd.json"
    assert main(["--requests", "0.02", "--gpus", "5", "2", "--links", "ib400,eth100", "--traces", "azure-code",
                 "--json", str(out), "--plot", ""]) == 0
    captured = capsys.readouterr()
    # 2 GPUs: colocated + 1 split x 2 links; 5 GPUs: colocated + 4 splits on the plan link alone
    assert "[3/8] azure-code P/D 1:1 eth100" in captured.err and "[8/8] azure-code P/D 4:1 ib400" in captured.err
    assert "ETA" in captured.err
    assert "| azure-code (" in captured.out and "agrees with the simulator's on" in captured.out
    assert "| 5 | azure-code | " in captured.out and "(gap)" in captured.out
    small, large = json.loads(out.read_text())["cases"]
    assert (small["gpus"], small["requests"], large["gpus"], large["requests"]) == (2, 12, 5, 15)
    assert small["rows"]["ib400"]["plan_best"] == "1:1" and set(small["rows"]["ib400"]["splits"]) == {"1:1"}
    assert set(small["rows"]) == {"colocated", "ib400", "eth100"} and set(large["rows"]) == {"colocated", "ib400"}
    assert len(large["rows"]["ib400"]["splits"]) == 4 and len(large["rows"]["ib400"]["plan_predicted_rps"]) == 4
