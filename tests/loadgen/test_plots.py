import matplotlib.image

from loadgen.plots import plot_runs
from loadgen.results import RequestRecord, RunResult
from loadgen.stats import summarize


def test_plot_is_a_1200_by_800_png_with_replicas(tmp_path):
    recs = [RequestRecord(index=i, send_time_s=i * 0.1, ttft_s=0.05 + i * 0.01, tpot_s=0.01, e2e_s=0.2,
                          ok=True, completion_tokens=5) for i in range(20)]
    runs = [RunResult(summary=summarize(recs), requests=recs, meta={"label": "a"}, replicas=[(0.0, 1), (1.0, 3)]),
            RunResult(summary=summarize(recs[:5]), requests=recs[:5], meta={"label": "b"})]
    out = tmp_path / "p.png"
    plot_runs(runs, out)
    assert matplotlib.image.imread(out).shape[:2] == (800, 1200)
