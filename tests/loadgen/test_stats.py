import pytest

from loadgen.results import RequestRecord, Slo
from loadgen.stats import latency_stats, meets_slo, parse_slo, summarize


def _rec(i, ttft, tpot, e2e, ok=True, backend="a", prompt=100, cached=0, completion=10):
    return RequestRecord(index=i, backend=backend, scheduled_time_s=float(i), send_time_s=float(i) + 0.002,
                         ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, itl_s=[tpot] * (completion - 1) if ok else [],
                         prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached, ok=ok,
                         error=None if ok else "HTTP 503: overloaded")


RECORDS = [
    _rec(0, 0.1, 0.01, 0.19, cached=50),
    _rec(1, 0.2, 0.02, 0.38, backend="b"),
    _rec(2, 0.3, 0.03, 0.57, cached=25),
    _rec(3, 0.4, 0.04, 0.76),
    _rec(4, None, None, 0.05, ok=False, backend="b", prompt=0, completion=0),
]


def test_percentiles_interpolate_linearly_as_numpy_and_benchmark_serving_do():
    stats = latency_stats([0.1, 0.2, 0.3, 0.4])
    assert stats.mean == pytest.approx(0.25)
    assert (stats.p50, stats.p90, stats.p99) == pytest.approx((0.25, 0.37, 0.397))
    assert latency_stats([]).p50 is None


def test_summary_counts_tokens_throughput_hit_rate_and_backends():
    s = summarize(RECORDS)
    assert (s.num_requests, s.num_ok, s.num_failed) == (5, 4, 1)
    # first send 0.002, last end 4.002 + 0.05 (the failed request)
    assert s.duration_s == pytest.approx(4.05)
    assert (s.total_prompt_tokens, s.total_completion_tokens, s.total_cached_tokens) == (400, 40, 75)
    assert s.prefix_hit_rate == pytest.approx(75 / 400)
    assert s.request_throughput_per_s == pytest.approx(4 / 4.05)
    assert s.output_throughput_tok_per_s == pytest.approx(40 / 4.05)
    assert s.total_throughput_tok_per_s == pytest.approx(440 / 4.05)
    assert s.requests_per_backend == {"a": 3, "b": 1}  # the failed request is not counted as served
    assert s.ttft_s.p50 == pytest.approx(0.25) and s.e2e_s.mean == pytest.approx(0.475)
    assert s.itl_s.mean == pytest.approx(0.025)  # 9 gaps from each of the four requests
    assert s.max_lateness_s == pytest.approx(0.002)
    assert s.goodput_per_s is None


def test_goodput_counts_requests_within_every_slo():
    s = summarize(RECORDS, parse_slo("ttft=0.25,tpot=0.03"))
    assert s.slo == Slo(ttft_s=0.25, tpot_s=0.03)
    assert s.goodput_per_s == pytest.approx(2 / 4.05)  # requests 0 and 1
    assert s.goodput_per_s == pytest.approx(summarize(RECORDS, Slo(ttft_s=0.2, e2e_s=0.4)).goodput_per_s)


def test_a_single_token_request_has_no_tpot_and_passes_that_slo():
    one = _rec(0, 0.1, None, 0.1, completion=1)
    assert meets_slo(one, Slo(ttft_s=0.2, tpot_s=0.001))
    assert not meets_slo(RECORDS[4], Slo())  # failed requests never count


@pytest.mark.parametrize(("spec", "message"), [("ttft", "expected KEY=SECONDS"), ("latency=1", "KEY in"),
                                               ("ttft=0", "must be > 0")])
def test_bad_slo_specs_say_what_is_expected(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_slo(spec)


def test_slo_attainment_is_the_share_of_sent_requests_that_met_the_slo_failures_missed() -> None:
    from loadgen.results import RequestRecord

    recs = [RequestRecord(index=0, ttft_s=0.1, e2e_s=0.5, ok=True),
            RequestRecord(index=1, ttft_s=0.9, e2e_s=1.0, ok=True),  # too slow
            RequestRecord(index=2, error="HTTP 503"),  # failed: missed
            RequestRecord(index=3, ttft_s=0.2, e2e_s=0.3, ok=True)]
    assert summarize(recs, parse_slo("ttft=0.5")).slo_attainment == pytest.approx(0.5)
    assert summarize(recs).slo_attainment is None
