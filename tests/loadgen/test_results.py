from loadgen.results import LatencyStats, RequestRecord, RunResult, Slo
from loadgen.stats import summarize


def test_a_result_survives_a_json_round_trip(tmp_path):
    records = [RequestRecord(index=0, session_id="s", backend="http://127.0.0.1:9001", scheduled_time_s=0.5,
                             send_time_s=0.501, ttft_s=0.1, itl_s=[0.01, 0.02], tpot_s=0.015, e2e_s=0.13,
                             prompt_tokens=12, completion_tokens=3, cached_tokens=8, ok=True),
               RequestRecord(index=1, error="HTTP 400: bad", e2e_s=0.01)]
    result = RunResult(summary=summarize(records, Slo(ttft_s=0.5)), requests=records,
                       meta={"label": "x", "speedup": 10}, replicas=[(0.0, 1), (1.0, 2)])
    path = tmp_path / "run.json"
    result.save(path)
    back = RunResult.load(path)
    assert back == result
    assert back.summary.ttft_s == LatencyStats(mean=0.1, p50=0.1, p90=0.1, p99=0.1, std=0.0, min=0.1, max=0.1,
                                               percentiles={"p50": 0.1, "p90": 0.1, "p99": 0.1})
    assert back.requests[0].lateness_s == 0.501 - 0.5 and back.label == "x"
