"""`python -m bench.routing_quality --quick` end to end: cells, stored cells, the files and the docs block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.routing_quality.__main__ import QUICK_REQUESTS, main


def _run(tmp_path: Path, *extra: str) -> int:
    return main(["--quick", "--workloads", "agents,mooncake-conversation", "--policies",
                 "round-robin,precise-prefix,sglang-cache-aware", "--out", str(tmp_path / "out"),
                 "--doc", str(tmp_path / "benchmarks.md"), "--img", str(tmp_path / "img"), "--quiet", *extra])


def test_quick_grid_writes_every_cell_the_table_the_plot_and_the_docs_block(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "benchmarks.md").write_text("# Benchmarks\n\nkept\n")
    assert _run(tmp_path) == 0
    out = tmp_path / "out"
    results = json.loads((out / "routing_quality.json").read_text())
    cells = results["cells"]
    assert [(c["workload"], c["policy"]) for c in cells] == [
        (w, p) for w in ("agents", "mooncake-conversation")
        for p in ("round-robin", "precise-prefix", "sglang-cache-aware")]
    for c in cells:
        assert c["error"] is None and c["ok"] == c["requests"] == QUICK_REQUESTS
        assert c["ttft_p99_s"] >= c["ttft_p50_s"] > 0 and c["e2e_p90_s"] > 0
        assert c["goodput_per_s"] is not None and 0 <= c["slo_attained"] <= 1
        assert c["prefill_max_over_mean"] >= 1.0 and len(c["prefill_tokens_per_replica"]) == 8
    assert {c["family"] for c in cells if c["policy"] == "sglang-cache-aware"} == {"peer"}
    assert {c["family"] for c in cells if c["policy"] != "sglang-cache-aware"} == {"flotilla"}
    agents = {c["policy"]: c for c in cells if c["workload"] == "agents"}
    assert agents["precise-prefix"]["hit_rate"] > 0.3  # the shared system prompt is found
    assert results["ideal_hit_rate"]["agents"] > 0.3
    assert (out / "routing_quality.png").stat().st_size > 0 and (tmp_path / "img" / "routing-quality.png").exists()
    table = (out / "routing_quality.md").read_text()
    assert "| sglang-cache-aware | peer |" in table and "TTFT ≤ 2 s and TPOT ≤ 100 ms" in table
    doc = (tmp_path / "benchmarks.md").read_text()
    assert doc.startswith("# Benchmarks\n\nkept\n") and "<!-- routing-quality:start -->" in doc
    assert "](img/routing-quality.png)" in doc
    assert "| precise-prefix | flotilla |" in capsys.readouterr().out


def test_a_second_run_reuses_the_stored_cells_stored_only_runs_none_and_fresh_reruns_them(tmp_path: Path) -> None:
    def run(*extra: str) -> int:
        return main(["--max-requests", "8", "--workloads", "agents", "--policies", "round-robin,prefix-aware",
                     "--out", str(tmp_path / "out"), "--no-write", "--quiet", *extra])

    assert run() == 0
    stored = sorted((tmp_path / "out" / "cells").glob("*.json"))
    assert len(stored) == 2
    before = {p.name: p.read_text() for p in stored}
    for p in stored:  # a stored cell is trusted as it is: mark them to see which are reused
        row = json.loads(p.read_text())
        row["wall_s"] = -1.0
        p.write_text(json.dumps(row))
    assert run() == 0
    cells = json.loads((tmp_path / "out" / "routing_quality.json").read_text())["cells"]
    assert {c["wall_s"] for c in cells} == {-1.0}
    assert run("--also", "least-load", "--stored-only") == 0  # reports the two, runs nothing
    assert len(list((tmp_path / "out" / "cells").glob("*.json"))) == 2
    assert "Not run (1 cells): agents: `least-load`." in (tmp_path / "out" / "routing_quality.md").read_text()
    assert run("--fresh") == 0
    cells = json.loads((tmp_path / "out" / "routing_quality.json").read_text())["cells"]
    assert all(c["wall_s"] > 0 for c in cells)
    assert {p.name for p in stored} == set(before)


def test_an_unknown_policy_or_workload_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--policies", "no-such-policy", "--out", str(tmp_path), "--no-write"]) == 2
    assert "no-such-policy" in capsys.readouterr().err
    assert main(["--quick", "--workloads", "nope", "--out", str(tmp_path), "--no-write"]) == 2
    assert "unknown workload 'nope'" in capsys.readouterr().err
