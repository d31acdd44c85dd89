"""llamacpp:* exposition: the captured families, llama-server's number format, scrape-reset throughput."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fake_engines.llamacpp.metrics import LlamaCounters, format_value, render_metrics
from fake_engines.llamacpp.shapes import Timings
from tests.conftest import DATA

CAPTURE = DATA / "real-engines" / "llama.cpp" / "034_metrics_after_basic_requests.http"


def _families(text: str) -> list[tuple[str, str, str]]:
    return [(f.name, f.type, f.documentation) for f in text_string_to_metric_families(text)]


def test_families_types_and_help_match_the_capture_in_order():
    real = CAPTURE.read_text().split("\n\n", 1)[1]
    assert _families(render_metrics(LlamaCounters(), 0, 0)) == _families(real)


def test_values_print_like_llama_server():
    assert [format_value(v) for v in (0, 901, 0.889468, 76.45018, 1.0071174)] == ["0", "901", "0.889468", "76.4502",
                                                                                  "1.00712"]


def test_throughput_gauges_cover_the_time_since_the_previous_scrape_then_reset():
    counters = LlamaCounters()
    counters.on_prompt_done(evaluated=100, cached=28, elapsed_s=0.5)
    counters.on_request_done(predicted=31, elapsed_s=0.3, n_tokens=158)
    counters.on_decode(busy_slots=2)
    counters.on_decode(busy_slots=1)
    first = render_metrics(counters, requests_processing=1, requests_deferred=3)
    assert "llamacpp:prompt_tokens_seconds 200\n" in first
    assert "llamacpp:predicted_tokens_seconds 100\n" in first  # 30 decode steps: the first token is free
    assert "llamacpp:prompt_tokens_cached_total 28\n" in first
    assert "llamacpp:n_busy_slots_per_decode 1.5\n" in first
    assert "llamacpp:requests_deferred 3\n" in first
    second = render_metrics(counters, 0, 0)
    assert "llamacpp:prompt_tokens_seconds 0\n" in second and "llamacpp:prompt_tokens_total 100\n" in second


def test_generation_rates_are_over_decode_steps_the_first_token_being_free():
    one = Timings(cache_n=0, prompt_n=0, prompt_ms=0.0, predicted_n=1, predicted_ms=0.001).body()
    assert (one["predicted_per_second"], one["predicted_per_token_ms"], one["prompt_per_token_ms"]) == (0.0, 0.0, 0.0)
    many = Timings(cache_n=2, prompt_n=8, prompt_ms=4.0, predicted_n=16, predicted_ms=30.0).body()
    assert many["predicted_per_token_ms"] == 2.0 and many["predicted_per_second"] == pytest.approx(500.0)  # 15 in 30 ms
    assert many["prompt_per_token_ms"] == 0.5 and many["prompt_per_second"] == pytest.approx(2000.0)
