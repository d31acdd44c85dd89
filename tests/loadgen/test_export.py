"""Exports other tools read: `vllm bench serve --save-result` JSON, and CSV."""

import csv
import json
import math

import pytest

from loadgen.export import output_format, summary_path, vllm_bench_result, write_csv, write_result
from loadgen.results import RequestRecord, RunResult
from loadgen.stats import parse_percentiles, parse_slo, summarize
from tests.conftest import REPO

VLLM_FILE = REPO / "tests" / "data" / "vllm-bench" / "random-6-prompts-rate-4.json"
PERCENTILES = (50.0, 90.0, 99.0, 99.9)  # as the reference file was written


def _hand_checked(percentiles=PERCENTILES) -> RunResult:
    """Two answers and one failure; every figure below is worked out by hand."""
    recs = [RequestRecord(index=0, scheduled_time_s=0.0, send_time_s=0.0, ttft_s=0.1, itl_s=[0.02, 0.04],
                          tpot_s=0.03, e2e_s=0.16, prompt_tokens=10, completion_tokens=3, ok=True, backend="a"),
            RequestRecord(index=1, scheduled_time_s=0.5, send_time_s=0.5, ttft_s=0.3, itl_s=[0.1], tpot_s=0.1,
                          e2e_s=0.4, prompt_tokens=20, completion_tokens=2, ok=True, backend="b"),
            RequestRecord(index=2, scheduled_time_s=1.0, send_time_s=1.0, error="HTTP 503: busy")]
    summary = summarize(recs, parse_slo("ttft=0.2"), percentiles=percentiles)
    return RunResult(summary=summary, requests=recs,
                     meta={"label": "hand", "model": "tiny", "endpoint": "completions",
                           "started_at": "2026-12-01T17:44:19+00:00", "flotilla_version": "0.1.0",
                           "command": "flotilla loadgen --target http://127.0.0.1:8000 ...",
                           "time_base": "wall", "time_scale": None, "trace_sha256": "ab" * 32})


def _vllm_type(value):
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


def test_a_vllm_bench_export_has_every_key_of_a_real_vllm_bench_serve_file_with_its_types() -> None:
    reference = json.loads(VLLM_FILE.read_text())
    ours = json.loads(json.dumps(vllm_bench_result(_hand_checked())))  # through JSON, as a script reads it
    assert set(reference) <= set(ours), sorted(set(reference) - set(ours))
    assert sorted(set(ours) - set(reference)) == ["flotilla_command", "flotilla_time_base",
                                                  "flotilla_trace_sha256", "flotilla_version"]
    for key, value in reference.items():
        if value is None:  # vLLM writes null for a label, max_concurrency or goodput not given
            continue
        assert _vllm_type(ours[key]) == _vllm_type(value), key
        if isinstance(value, int) and not isinstance(value, bool):
            assert isinstance(ours[key], type(value)), key  # counts stay integers
    assert (ours["date"], ours["backend"], ours["endpoint_type"]) == ("20261201-174419", "openai", "openai")


def test_scripts_written_for_vllm_bench_results_read_the_export_in_its_units() -> None:
    # what vllm/benchmarks/sweep reads: float(run["request_throughput"]), float(run["mean_e2el_ms"]),
    # run["output_throughput"]; milliseconds in every *_ms key
    for run in (json.loads(VLLM_FILE.read_text()), vllm_bench_result(_hand_checked())):
        concurrency = float(run["request_throughput"]) * float(run["mean_e2el_ms"]) / 1000
        assert 0 < concurrency < 10 and float(run["output_throughput"]) > 0
        assert run["median_ttft_ms"] == run["p50_ttft_ms"] and run["p99.9_itl_ms"] >= run["p99_itl_ms"]


def test_vllm_bench_numbers_on_a_hand_checked_run() -> None:
    out = vllm_bench_result(_hand_checked())
    expected = {
        "duration": 1.0, "completed": 2, "failed": 1, "num_prompts": 3, "total_input_tokens": 30,
        "total_output_tokens": 5, "request_throughput": 2.0, "output_throughput": 5.0,
        "total_token_throughput": 35.0, "request_goodput": 1.0,  # only the first is within ttft 200 ms
        "request_rate": 3.0,  # three scheduled over one second
        "max_output_tokens_per_s": 5.0, "max_concurrent_requests": 2,  # all within the first second
        "mean_ttft_ms": 200.0, "median_ttft_ms": 200.0, "std_ttft_ms": 100.0, "p90_ttft_ms": 280.0,
        "mean_tpot_ms": 65.0, "std_tpot_ms": 35.0, "p50_tpot_ms": 65.0,
        "mean_itl_ms": 160 / 3, "median_itl_ms": 40.0, "std_itl_ms": math.sqrt(10400 / 9),
        "mean_e2el_ms": 280.0, "std_e2el_ms": 120.0, "p99_e2el_ms": 160 + 0.99 * 240,
    }
    for key, value in expected.items():
        assert out[key] == pytest.approx(value), key
    assert out["latencies"] == [0.16, 0.4, 0.0] and out["queue_times"] == [0.0, 0.0, 0.0]
    assert out["p99.9_ttft_ms"] == pytest.approx(100 + 0.999 * 200)


def test_without_samples_a_metric_is_zero_as_vllm_writes_it_and_percentile_metrics_choose_keys() -> None:
    recs = [RequestRecord(index=0, ttft_s=0.1, e2e_s=0.1, completion_tokens=1, prompt_tokens=4, ok=True)]
    out = vllm_bench_result(RunResult(summary=summarize(recs), requests=recs), percentile_metrics=("tpot", "e2el"))
    assert (out["mean_tpot_ms"], out["p99_tpot_ms"], out["request_goodput"]) == (0.0, 0.0, None)
    assert "mean_ttft_ms" not in out and out["mean_e2el_ms"] == pytest.approx(100.0)


def test_the_flotilla_summary_has_std_min_max_and_the_chosen_percentiles() -> None:
    s = _hand_checked().summary
    assert (s.ttft_s.std, s.ttft_s.min, s.ttft_s.max) == pytest.approx((0.1, 0.1, 0.3))
    assert list(s.itl_s.percentiles) == ["p50", "p90", "p99", "p99.9"]
    assert s.itl_s.percentiles["p50"] == pytest.approx(0.04) and s.itl_s.max == pytest.approx(0.1)
    assert s.ttft_s.p90 == pytest.approx(0.28)  # the schema's p50/p90/p99 stay, whatever is chosen


@pytest.mark.parametrize(("spec", "expected"), [("50,90,99,99.9", (50.0, 90.0, 99.0, 99.9)), ("99", (99.0,)),
                                                ("75, 25,75", (75.0, 25.0))])
def test_percentiles_parse_in_the_order_given(spec, expected) -> None:
    assert parse_percentiles(spec) == expected


@pytest.mark.parametrize("spec", ["", "0", "101", "p99", "50,,abc"])
def test_bad_percentiles_say_what_is_expected(spec) -> None:
    with pytest.raises(ValueError, match="bad percentiles"):
        parse_percentiles(spec)


def test_csv_has_a_row_per_request_with_every_timing_and_a_summary_file(tmp_path) -> None:
    path = tmp_path / "run.csv"
    written = write_result(_hand_checked(), path)  # .csv: csv without being told
    assert written == [path, tmp_path / "run.summary.csv"] == [path, summary_path(path)]
    rows = list(csv.DictReader(path.open()))
    assert [r["index"] for r in rows] == ["0", "1", "2"]
    assert rows[0]["itl_s"].split() == ["0.02", "0.04"] and float(rows[0]["ttft_s"]) == 0.1
    assert (rows[0]["itl_count"], float(rows[0]["itl_max_s"]), rows[0]["ok"]) == ("2", 0.04, "1")
    assert (rows[2]["ok"], rows[2]["error"], rows[2]["ttft_s"]) == ("0", "HTTP 503: busy", "")
    (summary,) = csv.DictReader((tmp_path / "run.summary.csv").open())
    assert summary["label"] == "hand" and float(summary["ttft_s.p99.9"]) == pytest.approx(0.1 + 0.999 * 0.2)
    assert float(summary["ttft_s.std"]) == pytest.approx(0.1) and summary["num_failed"] == "1"
    assert summary["slo.ttft_s"] == "0.2" and summary["meta.trace_sha256"] == "ab" * 32


def test_output_format_follows_the_flag_else_the_file_name(tmp_path) -> None:
    assert (output_format(None, "a.json"), output_format(None, "a.csv"), output_format("vllm-bench", "a.csv")) \
        == ("json", "csv", "vllm-bench")
    with pytest.raises(ValueError, match="choose one of json, vllm-bench, csv"):
        output_format("xml", "a.xml")
    paths = write_csv(_hand_checked(), tmp_path / "noext")
    assert paths[1].name == "noext.summary.csv"
