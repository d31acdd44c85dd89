"""The comparison table: rows by policy, metrics by name, text with units; identical arrivals."""

import pytest

from flotilla.pytest_plugin import fleets
from flotilla.testing.compare import Comparison, Row, compare_policies, run_metrics
from loadgen.results import RequestRecord, RunResult, Slo
from loadgen.stats import summarize
from loadgen.trace import TraceRequest


def _result(e2e_s: list[float], backends: list[str], slo: Slo | None = None) -> RunResult:
    records = [RequestRecord(index=i, backend=b, send_time_s=float(i), ttft_s=e / 4, e2e_s=e, ok=True,
                             prompt_tokens=100, cached_tokens=25 * (i % 2), completion_tokens=1)
               for i, (e, b) in enumerate(zip(e2e_s, backends, strict=True))]
    return RunResult(summary=summarize(records, slo), requests=records)


def _table() -> Comparison:
    slow = _result([0.2, 2.4, 0.4, 0.8], ["0", "0", "0", "1"])
    fast = _result([0.2, 0.9, 0.4, 0.8], ["0", "1", "2", "0"])
    return Comparison((Row("round-robin", run_metrics(slow), slow), Row("least-outstanding", run_metrics(fast), fast)))


def test_metrics_flatten_the_summary_and_add_the_worst_latency_and_busiest_backend():
    m = run_metrics(_result([0.2, 2.4, 0.4, 0.8], ["0", "0", "0", "1"], Slo(e2e_s=1.0)))
    assert (m["num_ok"], m["e2e_max_s"], m["busiest_backend_share"]) == (4, 2.4, 0.75)
    assert m["ttft_p50_s"] == pytest.approx(0.15) and m["e2e_mean_s"] == pytest.approx(0.95)
    assert m["prefix_hit_rate"] == pytest.approx(50 / 400)
    assert m["goodput_per_s"] == pytest.approx(3 / 3.8)  # 3 within 1 s over 3.8 s from first send to last end


def test_rows_are_read_by_policy_then_metric_and_unknown_names_list_the_known_ones():
    table = _table()
    assert table.policies == ["round-robin", "least-outstanding"] and len(table) == 2
    assert table["least-outstanding"]["e2e_max_s"] == 0.9
    assert table.metric("e2e_max_s") == {"round-robin": 2.4, "least-outstanding": 0.9}
    assert table.best("e2e_max_s") == "least-outstanding"
    assert table.best("busiest_backend_share", lower_is_better=False) == "round-robin"
    with pytest.raises(KeyError, match="compared: \\['round-robin', 'least-outstanding'\\]"):
        table["random"]
    with pytest.raises(KeyError, match="e2e_p99_s"):
        table["round-robin"]["e2e_p100_s"]


def test_the_text_table_shows_latencies_in_ms_and_shares_in_percent():
    lines = _table().table(["e2e_max_s", "busiest_backend_share", "num_ok"]).splitlines()
    assert lines[0].split() == ["policy", "e2e_max", "ms", "busiest_backend_share", "%", "num_ok"]
    assert lines[2].split() == ["round-robin", "2400.0", "75.0", "4"]
    assert lines[3].split() == ["least-outstanding", "900.0", "50.0", "4"]
    assert "goodput" not in str(_table())  # no SLO was given, so no goodput column


def test_a_column_with_values_of_10_s_or_more_is_shown_in_seconds():
    long = _result([12.5], ["0"])
    lines = Comparison((Row("seed", run_metrics(long), long),)).table(["e2e_max_s"]).splitlines()
    assert lines[0].split() == ["policy", "e2e_max", "s"] and lines[2].split() == ["seed", "12.5"]


async def test_every_policy_replays_the_same_arrivals_on_a_fresh_fleet():
    reqs = [TraceRequest(timestamp_s=0.05 * i, input_length=32 + i, output_length=4) for i in range(8)]
    async with fleets("sim") as factory:
        table = await compare_policies(factory, ["round-robin", "least-outstanding", "power-of-two"], reqs,
                                       engines=2, max_requests=6)
    runs = [row.result for row in table]
    assert [r.meta["policy"] for r in runs] == ["round-robin", "least-outstanding", "power-of-two"]
    arrivals = {tuple((q.index, q.scheduled_time_s, q.prompt_tokens) for q in r.requests) for r in runs}
    assert len(arrivals) == 1 and len(next(iter(arrivals))) == 6


async def test_policy_and_unknown_options_are_refused_before_any_fleet_starts():
    async with fleets("sim") as factory:
        with pytest.raises(TypeError, match="list"):
            await compare_policies(factory, ["round-robin"], [], policy="round-robin")
        with pytest.raises(TypeError, match="replicas"):
            await compare_policies(factory, ["round-robin"], [], replicas=3)
