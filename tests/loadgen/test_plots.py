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


def _records(n: int, ttft_s: float, tokens: int = 5) -> list[RequestRecord]:
    return [RequestRecord(index=i, send_time_s=i * 0.1, ttft_s=ttft_s, tpot_s=0.01 if tokens > 1 else None,
                          e2e_s=ttft_s + 0.1, ok=True, completion_tokens=tokens) for i in range(n)]


def _legend_boxes(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [ax.get_legend().get_window_extent(renderer) for ax in fig.axes if ax.get_legend() is not None]


def test_without_tpot_values_the_panel_says_so_and_matplotlib_warns_nothing(recwarn) -> None:
    import warnings

    from loadgen.plots import plt, runs_figure

    recs = _records(10, 0.05, tokens=1)  # one-token answers have no TPOT
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "No artists with labels found" would fail here
        fig = runs_figure([RunResult(summary=summarize(recs), requests=recs, meta={"label": "a"})])
    tpot = fig.axes[1]
    assert tpot.get_title() == "TPOT CDF" and not tpot.lines and tpot.get_legend() is None
    assert [t.get_text() for t in tpot.texts] == ["no TPOT values"]
    plt.close(fig)


def test_a_constant_fleet_of_three_has_integer_replica_ticks_and_no_spike_at_zero() -> None:
    from loadgen.plots import plt, runs_figure

    recs = _records(20, 0.05)
    # a simulated fleet starts its replicas one by one at t=0
    run = RunResult(summary=summarize(recs), requests=recs, meta={"label": "sim"},
                    replicas=[(0.0, 1), (0.0, 2), (0.0, 3)])
    fig = runs_figure([run])
    twins = [ax for ax in fig.axes if ax.get_ylabel() == "ready replicas"]
    assert len(twins) == 2
    for twin in twins:
        ticks = [t for t in twin.get_yticks() if twin.get_ylim()[0] <= t <= twin.get_ylim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks)
        (line,) = twin.lines
        xs, ys = line.get_data()
        assert set(ys) == {3}  # drawn at 3 from t=0 to the last completion: no 1 -> 3 spike
        assert xs[0] == 0.0 and xs[-1] > 1.0
    plt.close(fig)


def test_large_ttfts_are_drawn_in_seconds_and_small_ones_in_ms() -> None:
    from loadgen.plots import plt, runs_figure

    slow, fast = _records(10, 200.0), _records(10, 0.05)
    fig = runs_figure([RunResult(summary=summarize(slow), requests=slow, meta={"label": "slow"})])
    assert fig.axes[0].get_xlabel() == "TTFT (s)" and fig.axes[3].get_ylabel() == "TTFT (s)"
    assert max(fig.axes[0].lines[0].get_xdata()) == 200.0
    plt.close(fig)
    fig = runs_figure([RunResult(summary=summarize(fast), requests=fast, meta={"label": "fast"})])
    assert fig.axes[0].get_xlabel() == "TTFT (ms)" and fig.axes[3].get_ylabel() == "TTFT (ms)"
    plt.close(fig)


def test_legends_of_long_policy_specs_fit_without_overlapping_each_other() -> None:
    from loadgen.plots import plt, runs_figure

    recs = _records(20, 0.05)
    specs = ["session-affinity:home=modulo,signal=prefill_tokens,bound=1.25",
             "weighted:prefix-aware=2,least-outstanding=1,kv-usage=0.5,queue=0.25"]
    runs = [RunResult(summary=summarize(recs), requests=recs, meta={"label": s}, replicas=[(0.0, 2), (1.0, 3)])
            for s in specs]
    fig = runs_figure(runs)
    boxes = _legend_boxes(fig)
    assert len(boxes) == 5  # three CDFs, TTFT over time, replicas against the rate
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b)
    width = fig.get_figwidth() * fig.dpi
    assert all(0 <= box.x0 and box.x1 <= width and box.y0 >= 0 for box in boxes)
    for ax in fig.axes:
        if ax.get_legend() is not None:
            assert all(len(line) <= 32 for t in ax.get_legend().get_texts() for line in t.get_text().splitlines())
    plt.close(fig)
