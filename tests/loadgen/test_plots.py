import matplotlib.image

from loadgen.plots import plot_runs
from loadgen.results import RequestRecord, RunResult
from loadgen.stats import summarize


def test_plot_is_a_1800_by_800_png_with_replicas_against_the_arrival_rate(tmp_path):
    recs = [RequestRecord(index=i, send_time_s=i * 0.1, ttft_s=0.05 + i * 0.01, tpot_s=0.01, e2e_s=0.2,
                          ok=True, completion_tokens=5) for i in range(20)]
    runs = [RunResult(summary=summarize(recs), requests=recs, meta={"label": "a"}, replicas=[(0.0, 1), (1.0, 3)]),
            RunResult(summary=summarize(recs[:5]), requests=recs[:5], meta={"label": "b"})]
    out = tmp_path / "p.png"
    plot_runs(runs, out)
    assert matplotlib.image.imread(out).shape[:2] == (800, 1800)


def test_pareto_front_keeps_the_runs_no_other_beats_on_cost_and_attainment() -> None:
    from loadgen.plots import pareto_front

    # (GPU-seconds, attainment): the second costs more for less; the others trade one for the other
    assert pareto_front([(100.0, 0.9), (150.0, 0.8), (200.0, 0.99), (100.0, 0.95)]) == [2, 3]


def test_pareto_plot_is_a_png(tmp_path):
    from loadgen.plots import plot_pareto
    from loadgen.stats import parse_slo

    recs = [RequestRecord(index=0, ttft_s=0.1, e2e_s=0.2, ok=True)]
    runs = [RunResult(summary=summarize(recs, parse_slo("ttft=1")), requests=recs,
                      meta={"label": name, "gpu_seconds": cost}) for name, cost in (("a", 10.0), ("b", 20.0))]
    out = tmp_path / "pareto.png"
    plot_pareto(runs, out)
    assert matplotlib.image.imread(out).shape[:2] == (600, 800)
