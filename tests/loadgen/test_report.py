from loadgen.report import compare_table, latency_table, summary_table
from loadgen.results import RequestRecord, RunResult
from loadgen.stats import parse_slo, summarize


def _result(label, ttft):
    recs = [RequestRecord(index=i, scheduled_time_s=i, send_time_s=i, ttft_s=ttft, tpot_s=0.01, e2e_s=ttft + 0.09, itl_s=[0.01] * 9,
                          prompt_tokens=100, completion_tokens=10, cached_tokens=25, ok=True, backend="r0")
            for i in range(4)]
    return RunResult(summary=summarize(recs, parse_slo("ttft=0.2")), requests=recs, meta={"label": label})


def test_latency_table_prints_milliseconds_per_percentile():
    lines = latency_table(_result("a", 0.25).summary).splitlines()
    assert lines[0].split() == ["latency", "mean", "p50", "p90", "p99"]
    assert lines[2].split() == ["TTFT", "(ms)", "250.0", "250.0", "250.0", "250.0"]
    assert lines[3].split() == ["TPOT", "(ms)", "10.0", "10.0", "10.0", "10.0"]


def test_summary_table_has_goodput_hit_rate_and_backends():
    text = summary_table(_result("a", 0.1))
    rows = {line[:24].strip(): line[24:].split() for line in text.splitlines()}
    assert rows["goodput (req/s)"] == [f"{4 / 3.19:.2f}"]
    assert rows["prefix hit rate"] == ["25.0%"]
    assert rows["backend r0"] == ["4"]
    assert rows["goodput SLO (s)"] == ["ttft=0.2"]


def test_compare_table_puts_runs_side_by_side():
    lines = compare_table([_result("fast", 0.1), _result("slow", 0.3)]).splitlines()
    assert lines[0].split() == ["figure", "fast", "slow"]
    ttft_p50 = next(line for line in lines if line.startswith("TTFT p50"))
    assert ttft_p50.split()[-2:] == ["100.0", "300.0"]
    goodput = next(line for line in lines if line.startswith("goodput"))
    assert goodput.split()[-1] == "0.00"  # no request of the slow run meets ttft=0.2
