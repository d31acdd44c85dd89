"""In-flight accounting on top of scraped signals, and pool membership."""

from policies.routing.base import BackendState
from proxy.config import BackendSpec, BreakerConfig
from proxy.engine_metrics import LoadSample
from proxy.pool import BackendPool


def ready_pool(*urls: str) -> BackendPool:
    pool = BackendPool(BreakerConfig(failure_threshold=2, success_threshold=1, open_s=5))
    for url in urls:
        pool.add(BackendSpec(url=url)).state = BackendState.READY
    return pool


def test_requests_picked_since_the_last_scrape_are_added_to_the_engines_waiting_count() -> None:
    pool = ready_pool("http://a:1")
    b = pool.backends[0]
    epoch = pool.begin_scrape(b)
    r1 = pool.reserve(b, 100)  # picked after the scrape was sent: the page cannot include it
    pool.record_scrape(b, LoadSample(num_requests_waiting=2.0, kv_cache_usage=0.5, cache_capacity_tokens=1000),
                       epoch, sent_at_s=10.0)
    r2 = pool.reserve(b, 50)
    view = pool.views(now_s=10.5)[0]
    assert (view.num_requests_waiting, view.kv_cache_usage) == (4.0, 0.65)
    assert (view.in_flight, view.in_flight_tokens, view.metrics_age_s) == (2, 150, 0.5)
    # The next scrape was sent after both picks, so it counts them itself.
    epoch = pool.begin_scrape(b)
    pool.record_scrape(b, LoadSample(num_requests_waiting=4.0), epoch, sent_at_s=11.0)
    assert pool.views(now_s=11.0)[0].num_requests_waiting == 4.0
    pool.release(r1)
    pool.release(r2)
    pool.release(r2)  # a second release is a no-op
    assert (b.in_flight, b.in_flight_tokens, b.unseen) == (0, 0, {})


def test_a_finished_request_stops_counting_as_unseen() -> None:
    pool = ready_pool("http://a:1")
    b = pool.backends[0]
    pool.record_scrape(b, LoadSample(num_requests_waiting=0.0), pool.begin_scrape(b), 0.0)
    r = pool.reserve(b, 10)
    assert pool.views(0.0)[0].num_requests_waiting == 1.0
    pool.release(r)
    assert pool.views(0.0)[0].num_requests_waiting == 0.0


def test_ejected_draining_and_starting_backends_are_not_routable() -> None:
    pool = ready_pool("http://a:1", "http://b:1", "http://c:1")
    pool.backends[2].state = BackendState.STARTING
    a = pool.backends[0]
    assert not pool.record_failure(a, 0.0)
    assert pool.record_failure(a, 0.0) and a.state is BackendState.EJECTED
    assert [v.url for v in pool.views(1.0)] == ["http://b:1"]
    assert [v.url for v in pool.views(5.0)] == ["http://a:1", "http://b:1"]  # half-open


def test_draining_backend_leaves_after_its_last_request() -> None:
    pool = ready_pool("http://a:1", "http://b:1")
    r = pool.reserve(pool.backends[0], 1)
    pool.drain("http://a:1")
    assert len(pool) == 2 and [v.url for v in pool.views(0.0)] == ["http://b:1"]
    generation = pool.generation
    pool.release(r)
    assert [b.url for b in pool] == ["http://b:1"] and pool.generation == generation + 1


def test_model_filter_keeps_backends_that_serve_it_or_say_nothing() -> None:
    pool = ready_pool("http://a:1", "http://b:1", "http://c:1")
    pool.backends[0].discovered_models = frozenset({"m1"})
    pool.backends[1].discovered_models = frozenset({"m2"})
    assert [v.url for v in pool.views(0.0, "m2")] == ["http://b:1", "http://c:1"]
    assert not pool.is_unknown_model("m3")  # c might serve it
    pool.backends[2].discovered_models = frozenset({"m1"})
    assert pool.is_unknown_model("m3")


def test_views_are_rebuilt_only_for_backends_that_changed() -> None:
    pool = ready_pool("http://a:1", "http://b:1")
    a0, b0 = pool.views(1.0)
    pool.reserve(pool.backends[0], 5)
    a1, b1 = pool.views(1.001)
    assert b1 is b0 and a1 is not a0 and a1.in_flight == 1
    pool.record_scrape(pool.backends[1], LoadSample(num_requests_waiting=1.0), pool.begin_scrape(pool.backends[1]),
                       sent_at_s=1.0)
    assert pool.views(1.002)[1].num_requests_waiting == 1.0
    assert pool.views(1.5)[1].metrics_age_s == 0.5  # ages move on even when nothing else does


def test_model_labels_are_bounded_to_served_models() -> None:
    pool = ready_pool("http://a:1")
    pool.backends[0].discovered_models = frozenset({"m1"})
    assert [pool.model_label(m) for m in ("m1", "random-123", None)] == ["m1", "other", ""]


def test_an_adapter_is_known_when_some_backend_lists_it() -> None:
    pool = ready_pool("http://a:1", "http://b:1")
    pool.backends[1].adapters = frozenset({"sql-lora"})
    assert pool.has_adapter("sql-lora") and not pool.has_adapter("m1")
