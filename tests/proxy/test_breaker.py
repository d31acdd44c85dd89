from proxy.breaker import (
    CircuitBreaker,
    CircuitState,
    Outcome,
    ProbeOutcome,
    ProbeResult,
    classify_probe,
    outcome_of_status,
)
from proxy.config import BreakerConfig


def test_circuit_opens_after_n_consecutive_failures_only() -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=3, success_threshold=2, open_s=10))
    assert not b.record_failure(0) and not b.record_failure(1)
    b.record_success()  # a success in between resets the count
    assert not b.record_failure(2) and not b.record_failure(3)
    assert b.record_failure(4)
    assert b.state is CircuitState.OPEN and not b.allows_request(13.9)


def test_half_open_lets_one_probe_through_and_closes_after_m_successes() -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=1, success_threshold=2, open_s=10))
    b.record_failure(0)
    assert b.allows_request(10.0) and b.state is CircuitState.HALF_OPEN
    b.start_probe()
    assert not b.allows_request(10.1)  # one probe at a time
    assert not b.record_success()
    assert b.allows_request(10.2)
    assert b.record_success() and b.state is CircuitState.CLOSED


def test_a_failed_half_open_probe_reopens_for_another_wait() -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=1, success_threshold=1, open_s=10))
    b.record_failure(0)
    assert b.allows_request(10)
    assert b.record_failure(10)
    assert not b.allows_request(19.9) and b.allows_request(20)


def test_probes_tell_a_loading_engine_from_a_failed_one() -> None:
    loading_llama = ProbeResult(503, b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}')
    refused = ProbeResult(None, connection_refused=True)
    assert classify_probe(ProbeResult(200), ever_ready=False) is ProbeOutcome.HEALTHY
    assert classify_probe(loading_llama, ever_ready=True) is ProbeOutcome.LOADING
    assert classify_probe(refused, ever_ready=False) is ProbeOutcome.LOADING  # vLLM while loading
    assert classify_probe(refused, ever_ready=True) is ProbeOutcome.FAILED  # an engine that went away
    assert classify_probe(ProbeResult(503, b""), ever_ready=True) is ProbeOutcome.FAILED  # vLLM engine dead
    assert classify_probe(ProbeResult(None), ever_ready=False) is ProbeOutcome.FAILED  # timeout
    stalled = ProbeResult(None, stalled=True)  # the timeout fired late: the proxy was stalled
    assert classify_probe(stalled, ever_ready=True) is ProbeOutcome.INCONCLUSIVE


def test_only_5xx_blames_the_backend_4xx_is_neutral_and_the_rest_success() -> None:
    assert [outcome_of_status(s) for s in (200, 204, 400, 404, 413, 422, 429, 500, 502, 503)] == [
        Outcome.SUCCESS, Outcome.SUCCESS, *[Outcome.NEUTRAL] * 5, *[Outcome.FAILURE] * 3]


def test_a_neutral_end_frees_the_half_open_probe_slot_and_counts_neither_way() -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=1, success_threshold=1, open_s=1))
    b.record_failure(0)
    assert b.allows_request(1.0)
    b.start_probe()
    assert not b.allows_request(1.0)  # one probe at a time
    b.record_neutral()  # its client went away: the probe says nothing
    assert b.state is CircuitState.HALF_OPEN and b.allows_request(1.0)
