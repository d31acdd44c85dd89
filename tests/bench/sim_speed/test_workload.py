"""The benchmark's looped trace: passes follow one another at the trace's own pace."""

from __future__ import annotations

from pathlib import Path

from bench.sim_speed.workload import looped


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.0000000,374,44\n"
                    "2023-11-16 18:15:47.0000000,396,109\n"
                    "2023-11-16 18:15:49.0000000,10,1\n")
    return path


def test_passes_are_shifted_by_span_plus_mean_gap(tmp_path: Path) -> None:
    requests = list(looped(_trace(tmp_path), 8))
    assert [r.timestamp_s for r in requests] == [0.0, 1.0, 3.0, 4.5, 5.5, 7.5, 9.0, 10.0]  # period 3 + 1.5
    assert [r.input_length for r in requests] == [374, 396, 10] * 2 + [374, 396]
    assert [r.output_length for r in requests][:3] == [44, 109, 1]
