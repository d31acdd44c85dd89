"""Parsing real /metrics captures of vLLM 0.32 and llama-server into routing signals."""

from pathlib import Path

from proxy.engine_metrics import parse_engine_metrics
from tests.conftest import DATA

REAL = DATA / "real-engines"


def page(rel: str) -> str:
    text = Path(REAL / rel).read_text()
    if text.startswith("HTTP/"):  # raw curl -i capture: drop the status line and headers
        text = text.replace("\r\n", "\n").split("\n\n", 1)[1]
    return text


def test_vllm_under_load_gives_running_waiting_kv_usage_and_cache_capacity() -> None:
    s = parse_engine_metrics(page("vllm/071_concurrency_nonstream_metrics_snapshot_during_load.txt"))
    assert s.num_requests_running == 2.0
    assert s.num_requests_waiting == 3.0
    assert s.kv_cache_usage == 0.0006103888176768324
    assert s.cache_capacity_tokens == 16384 * 128  # num_gpu_blocks x block_size
    assert s.metrics["vllm:prefix_cache_queries_total"] >= s.metrics["vllm:prefix_cache_hits_total"]
    assert not any(name.startswith(("python_", "process_")) for name in s.metrics)


def test_vllm_lora_adapters_come_from_the_newest_lora_requests_info_series() -> None:
    during = parse_engine_metrics(page("vllm/lora/018_metrics_during_3_lora_requests.http"))
    assert during.lora_adapters == frozenset({"lora-a"})
    assert during.max_lora == 2
    # Afterwards the newest series is the empty one, though older series still name adapters.
    after = parse_engine_metrics(page("vllm/lora/019_metrics_final.http"))
    assert after.lora_adapters == frozenset()


def test_llama_server_processing_and_deferred_are_running_and_waiting() -> None:
    s = parse_engine_metrics(page("llama.cpp/079_concurrency_nonstream_metrics_snapshot_during_load.txt"))
    assert s.num_requests_running == 1.0
    assert s.num_requests_waiting == 0.0
    assert s.kv_cache_usage is None and s.cache_capacity_tokens is None
    assert s.metrics["llamacpp:prompt_tokens_cached_total"] == 1501


def test_legacy_vllm_and_llama_cpp_kv_names_are_understood() -> None:
    legacy_vllm = (
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.75\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 3.0\n'
    )
    s = parse_engine_metrics(legacy_vllm)
    assert s.kv_cache_usage == 0.5  # averaged over data-parallel engines
    assert s.num_requests_waiting == 5.0  # summed over them
    old_llama = "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.125\n"
    assert parse_engine_metrics(old_llama).kv_cache_usage == 0.125


def test_a_page_without_engine_metrics_gives_no_signals() -> None:
    s = parse_engine_metrics("# TYPE python_info gauge\npython_info 1.0\n")
    assert s.num_requests_running is None and s.num_requests_waiting is None and s.metrics == {}


def test_histograms_are_skipped_but_untyped_samples_kept() -> None:
    page = ("# TYPE vllm:e2e_request_latency_seconds histogram\n"
            'vllm:e2e_request_latency_seconds_bucket{le="1.0"} 3.0\n'
            "vllm:e2e_request_latency_seconds_sum 2.5\n"
            "vllm:e2e_request_latency_seconds_count 3.0\n"
            "vllm:num_requests_waiting 4\n")
    s = parse_engine_metrics(page)
    assert s.num_requests_waiting == 4.0
    assert not any("e2e" in name for name in s.metrics)
