"""Routable-backend filtering and load signals."""

from __future__ import annotations

from policies.routing import BackendState, BackendView, least_loaded, load_of, routable_backends
from policies.routing.signals import is_known_signal


def test_only_ready_backends_serving_the_model_are_routable():
    backends = [
        BackendView(0, "a", state=BackendState.STARTING),
        BackendView(1, "b", models=frozenset({"llama"})),
        BackendView(2, "c", models=frozenset({"qwen"})),
        BackendView(3, "d"),
        BackendView(4, "e", state=BackendState.DRAINING),
        BackendView(5, "f", state=BackendState.EJECTED),
    ]
    assert [b.index for b in routable_backends(backends)] == [1, 2, 3]
    assert [b.index for b in routable_backends(backends, "llama")] == [1, 3]


def test_each_signal_reads_its_field():
    b = BackendView(
        0,
        "a",
        in_flight=3,
        in_flight_tokens=900,
        prefill_tokens=1234.0,
        num_requests_waiting=5,
        num_requests_running=7,
        kv_cache_usage=0.25,
        metrics={"llamacpp:requests_deferred": 2.0},
    )
    assert load_of(b) == 3.0
    assert load_of(b, "in_flight_tokens") == 900.0
    assert load_of(b, "prefill_tokens") == 1234.0
    assert load_of(b, "waiting") == 5.0
    assert load_of(b, "running") == 7.0
    assert load_of(b, "kv_cache_usage") == 0.25
    assert load_of(b, "llamacpp:requests_deferred") == 2.0
    assert load_of(b, "vllm:absent_metric") == 0.0


def test_engine_counts_never_scraped_read_as_router_in_flight():
    b = BackendView(0, "a", in_flight=4)
    assert load_of(b, "waiting") == 4.0
    assert load_of(b, "running") == 4.0
    assert load_of(b, "kv_cache_usage") == 0.0


def test_least_loaded_breaks_ties_on_lowest_index():
    backends = [BackendView(i, str(i), in_flight=n) for i, n in enumerate([2, 1, 3, 1])]
    assert least_loaded(backends).index == 1


def test_metric_signals_need_an_engine_prefix_so_typos_are_caught():
    assert is_known_signal("vllm:num_requests_waiting")
    assert is_known_signal("llamacpp:requests_deferred")
    assert not is_known_signal("inflight")
    assert not is_known_signal("in-flight")
