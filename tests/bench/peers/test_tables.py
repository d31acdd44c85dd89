"""The overhead and quality tables built from JSON rows."""

from __future__ import annotations

import pytest

from bench.peers import overhead_report, quality_report
from bench.peers.overhead import OverheadConfig


def _phase(target: str, phase: str, rnd: int, p50: float, cpu: float | None, noisy: bool = False) -> dict:
    return {"target": target, "phase": phase, "round": rnd, "p50_ms": p50, "p99_ms": 2 * p50, "rate_rps": 100.0 * rnd,
            "requests": 1000, "errors": 0, "router_cpu_s": cpu, "cpu_ms_per_req": None if cpu is None else cpu,
            "other_cores": 0.3 if noisy else 0.05, "attempts": 2 if noisy else 1, "noisy": noisy, "wall_s": 5.0}


def _records() -> list[dict]:
    rows = []
    for rnd in (1, 2):
        for phase in ("low", "high", "stream", "max"):
            rows.append(_phase("direct", phase, rnd, 1.0 * rnd, None))
            rows.append(_phase("nginx", phase, rnd, 1.5 * rnd, 0.2, noisy=(phase == "max" and rnd == 2)))
    return rows


def test_overhead_row_has_added_latency_cpu_and_noise() -> None:
    text = overhead_report.table(_records(), {"low": 20, "high": 200, "stream": 100})
    direct, nginx = text.splitlines()[2:4]
    cells = [c.strip() for c in nginx.strip("|").split("|")]
    assert cells[1] == "2.25 [1.50–3.00] / 4.5 [3.0–6.0]"
    assert cells[2] == "+0.75"  # median 2.25 minus direct's 1.50
    assert cells[7] == "0.200 ; 0.200 ; 0.200"
    assert cells[8] == "150 [100–200]"
    assert cells[11] == "0.30† (1)"
    assert direct.split("|")[8].strip() == "–"


def test_quality_row_shows_hit_rate_goodput_and_split() -> None:
    runs = [{"router": "flotilla prefix-aware", "workload": "agents", "round": r, "ok": 96, "sent": 96,
             "ttft_p50_s": 0.010 * r, "ttft_p99_s": 0.04, "e2e_p99_s": 0.16, "goodput_per_s": 8.0 + r,
             "throughput_per_s": 9.0, "engine_hit_rate": 0.8, "per_engine": [300, 100, 0, 0],
             "router_cpu_s": 1.0, "other_cores": 0.1, "noisy": False} for r in (1, 2)]
    row = quality_report.table(runs, "agents").splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "15 [10–20]"
    assert cells[4] == "80.0"
    assert cells[5] == "9.50 [9.00–10.00]"
    assert cells[6] == "96/96 ; 96/96"
    assert cells[7] == "75/25/0/0"


def test_overhead_config_names_the_bad_field() -> None:
    with pytest.raises(ValueError, match="high_rate"):
        OverheadConfig(high_rate=0)


def test_max_rate_is_paired_with_the_reference_round_by_round() -> None:
    rows = []
    for rnd, (ours, ref) in enumerate([(900, 1000), (1200, 1000), (600, 500)], start=1):
        rows.append(_phase("direct", "max", rnd, 1.0, None) | {"rate_rps": 5000.0})
        rows.append(_phase("flotilla", "max", rnd, 1.0, 0.1) | {"rate_rps": float(ours)})
        rows.append(_phase(overhead_report.REFERENCE, "max", rnd, 1.0, 0.1) | {"rate_rps": float(ref)})
    text = overhead_report.paired(rows)
    lines = text.splitlines()
    assert len(lines) == 3  # head, rule, flotilla: neither direct nor the reference itself
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    # 90, 120 and 120 %: the third round's machine was slow for both, which pairing cancels
    assert cells == ["flotilla", "120 [90–120]", "2 of 3"]
    assert overhead_report.paired([r for r in rows if r["target"] != overhead_report.REFERENCE]) == ""
    assert overhead_report.tables(rows, {"low": 20, "high": 200, "stream": 100}).endswith(text)
