"""The vllm:* exposition matches a real vLLM 0.32 scrape family for family."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fake_engines.vllm.metrics import FinishedRecord, StepRecord, VllmMetrics, build_1_2_5_buckets
from tests.conftest import DATA

CAPTURE = DATA / "real-engines" / "vllm" / "029_metrics_after_basic_requests.http"
LORA_CAPTURE = DATA / "real-engines" / "vllm" / "lora" / "019_metrics_final.http"


def _families(text: str) -> dict[str, tuple[str, set[str], tuple[str, ...]]]:
    """vllm:* family -> (type, label names, bucket bounds)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("vllm:"):
            continue
        labels = {k for s in fam.samples for k in s.labels if k != "le"}
        bounds = tuple(s.labels["le"] for s in fam.samples if s.name.endswith("_bucket"))
        out[fam.name] = (fam.type, labels, tuple(dict.fromkeys(bounds)))
    return out


def _capture_body(path) -> str:
    return path.read_text(encoding="utf-8", errors="replace").split("\n\n", 1)[1]


def _ours(max_loras=None) -> VllmMetrics:
    cache = dict(re.findall(r'(\w+)="([^"]*)"', _cache_config_line()))
    cache.pop("engine")
    return VllmMetrics("tiny-llama", 2048, cache, max_loras=max_loras)


def _cache_config_line() -> str:
    return next(line for line in _capture_body(CAPTURE).splitlines() if line.startswith("vllm:cache_config_info"))


def test_1_2_5_buckets_stop_at_max_model_len_as_captured():
    assert build_1_2_5_buckets(2048) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]


def test_every_captured_vllm_family_has_the_same_type_labels_and_buckets():
    real = _families(_capture_body(CAPTURE))
    ours = _families(_ours().render().decode())
    assert set(ours) == set(real)
    for name, (kind, labels, bounds) in real.items():
        assert ours[name] == (kind, labels, bounds), name


def test_lora_requests_info_has_vllm_labels_and_keeps_old_series():
    metrics = _ours(max_loras=2)
    metrics.record_lora(["lora-a"], ["lora-a"], 100.0)
    metrics.record_lora([], [], 200.0)
    fams = _families(metrics.render().decode())
    assert fams["vllm:lora_requests_info"] == _families(_capture_body(LORA_CAPTURE))["vllm:lora_requests_info"]
    text = metrics.render().decode()
    assert 'vllm:lora_requests_info{max_lora="2",running_lora_adapters="lora-a",waiting_lora_adapters="lora-a"} 100.0' in text
    assert 'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 200.0' in text


def test_step_and_finish_records_move_the_counters_vllm_moves():
    metrics = _ours()
    metrics.record_step(StepRecord(iteration_tokens=40, prompt_tokens=32, generation_tokens=2, ttfts_s=[0.05],
                                   prefix_queries_tokens=32, prefix_hits_tokens=16, num_running=2, num_waiting=3,
                                   kv_cache_usage=0.25))
    metrics.record_finished(FinishedRecord("length", 16, 8, 8, 8, 1, 1.0, 0.1, 0.2, 0.7, 0, 16))
    fams = {s.name + str(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}
    base = "[('engine', '0'), ('model_name', 'tiny-llama')]"
    assert fams["vllm:num_requests_waiting" + base] == 3
    assert fams["vllm:prompt_tokens_total" + base] == 32
    assert fams["vllm:prefix_cache_hits_total" + base] == 16
    assert fams["vllm:iteration_tokens_total_sum" + base] == 40
    length = "[('engine', '0'), ('finished_reason', 'length'), ('model_name', 'tiny-llama')]"
    assert fams["vllm:request_success_total" + length] == 1
    assert fams["vllm:request_time_per_output_token_seconds_sum" + base] == pytest.approx(0.7 / 7)


def test_families_come_in_the_captured_order_after_python_and_process():
    real = [f.name for f in text_string_to_metric_families(_capture_body(CAPTURE))]
    metrics = _ours()
    metrics.http.observe("/v1/models", "GET", 200, 0, 458, 0.002)  # the _created families need a series
    ours = [f.name for f in text_string_to_metric_families(metrics.render().decode())]
    assert ours == real
