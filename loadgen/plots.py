"""PNG plots of one or more runs: latency CDFs, TTFT over time, replicas against the arrival
rate, and the cost/SLO Pareto plot of several runs."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from loadgen.results import RunResult  # noqa: E402

_CDFS = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s"))
SECONDS_ABOVE_MS = 10_000.0
"""A latency axis whose largest value passes this many milliseconds is drawn in seconds."""
LEGEND_WRAP = 32
"""Legend entries (policy specs run long) are wrapped at this many characters."""


def seconds_or_ms(values_s: Sequence[float]) -> tuple[float, str]:
    """(multiplier from seconds, unit) for an axis of `values_s`: ms, or s once they pass
    `SECONDS_ABOVE_MS` milliseconds."""
    largest = max((abs(v) for v in values_s), default=0.0)
    return (1.0, "s") if largest * 1000 > SECONDS_ABOVE_MS else (1000.0, "ms")


def _wrapped(label: str) -> str:
    """`label` in lines of at most LEGEND_WRAP characters, broken after commas and colons
    where it can be (a policy spec's options), mid-word only where it must."""
    lines: list[str] = []
    for part in re.findall(r"[^,:]*[,:]?", label):
        if lines and len(lines[-1]) + len(part) <= LEGEND_WRAP:
            lines[-1] += part
        elif part:
            lines += textwrap.wrap(part, LEGEND_WRAP) or [part]
    return "\n".join(lines) or label


def _legend_below(ax: plt.Axes, *others: plt.Axes) -> None:
    """One legend for `ax` and its twins, under the axes, so it covers neither data nor the
    legends of neighbouring panels; none when nothing is labelled."""
    handles, labels = [], []
    for a in (ax, *others):
        h, lab = a.get_legend_handles_labels()
        handles += h
        labels += [_wrapped(x) for x in lab]
    if handles:
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize="small",
                  ncol=min(2, len(handles)), frameon=False)


def replica_series(result: RunResult) -> tuple[list[float], list[int]]:
    """(times, ready replicas) to draw as steps: one sample per time (the last; a simulated
    fleet reports each replica it starts at t=0), held until the run's last completion."""
    last: dict[float, int] = {}
    for t, n in result.replicas:
        last[t] = n
    if not last:
        return [], []
    times, counts = list(last), list(last.values())
    end = max((r.send_time_s + (r.e2e_s or 0.0) for r in result.requests), default=times[-1])
    if end > times[-1]:
        times.append(end)
        counts.append(counts[-1])
    return times, counts


def _integer_replicas(ax: plt.Axes, top: int) -> None:
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, max(1, top) + 1)
    ax.set_ylabel("ready replicas")


def _cdf(ax: plt.Axes, values: list[float], label: str, scale: float = 1000.0) -> None:
    if not values:
        return
    xs = np.sort(np.asarray(values) * scale)
    ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=label)


def _over_time(ax: plt.Axes, results: Sequence[RunResult]) -> None:
    oks = [[r for r in res.requests if r.ok and r.ttft_s is not None] for res in results]
    scale, unit = seconds_or_ms([r.ttft_s or 0.0 for ok in oks for r in ok])
    for res, ok in zip(results, oks, strict=True):
        ax.scatter([r.send_time_s for r in ok], [(r.ttft_s or 0.0) * scale for r in ok], s=6, label=res.label)
    ax.set(xlabel="send time (s)", ylabel=f"TTFT ({unit})", title="TTFT over time")
    with_replicas = [r for r in results if r.replicas]
    if with_replicas:
        twin = ax.twinx()
        for res in with_replicas:
            twin.step(*replica_series(res), where="post", linestyle="--", label=f"{res.label} replicas")
        _integer_replicas(twin, max(n for r in with_replicas for _, n in r.replicas))
        _legend_below(ax, twin)
    else:
        _legend_below(ax)


def arrival_rate(result: RunResult, bins: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """(bin start times, requests per second scheduled in each bin) over the run."""
    times = np.asarray([r.scheduled_time_s for r in result.requests], dtype=float)
    if len(times) == 0:
        return np.zeros(0), np.zeros(0)
    span = max(float(times.max()), 1e-9)
    counts, edges = np.histogram(times, bins=bins, range=(0.0, span))
    return edges[:-1], counts / (span / bins)


def _replicas_vs_rate(ax: plt.Axes, results: Sequence[RunResult]) -> None:
    if results:  # every run of a comparison replays the same arrivals: one rate curve
        starts, rate = arrival_rate(results[0])
        ax.fill_between(starts, rate, step="post", alpha=0.25, color="grey", label="arrival rate")
    ax.set(xlabel="time (s)", ylabel="arrivals (req/s)", title="replicas against the arrival rate")
    twin = ax.twinx()
    for res in results:
        if res.replicas:
            twin.step(*replica_series(res), where="post", label=res.label)
    _integer_replicas(twin, max((n for r in results for _, n in r.replicas), default=1))
    _legend_below(ax, twin)


def plot_runs(results: Sequence[RunResult], path: str | Path) -> None:
    """Write a PNG with a CDF per latency, TTFT over send time and ready replicas against the
    arrival rate, one series per run."""
    fig = runs_figure(results)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def runs_figure(results: Sequence[RunResult]) -> plt.Figure:
    """The figure `plot_runs` writes (axes: TTFT, TPOT and E2E CDFs, TTFT over time, replicas
    against the arrival rate), for a caller or a test to inspect before it is closed."""
    fig, axes = plt.subplots(2, 3, figsize=(18, 8))
    for ax, (label, name) in zip(axes.flat, _CDFS, strict=False):
        samples = [[getattr(r, name) for r in res.requests if r.ok and getattr(r, name) is not None]
                   for res in results]
        scale, unit = seconds_or_ms([v for run in samples for v in run])
        for res, values in zip(results, samples, strict=True):
            _cdf(ax, values, res.label, scale)
        ax.set(xlabel=f"{label} ({unit})", ylabel="fraction of requests", title=f"{label} CDF")
        ax.grid(alpha=0.3)
        if not any(samples):  # e.g. TPOT of one-token answers: say so instead of an empty frame
            ax.text(0.5, 0.5, f"no {label} values", ha="center", va="center", transform=ax.transAxes)
        _legend_below(ax)
    _over_time(axes.flat[3], results)
    _replicas_vs_rate(axes.flat[4], results)
    axes.flat[5].axis("off")
    fig.tight_layout()
    return fig


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indexes of the points no other point beats: none costs no more and attains no less, one
    of the two strictly (cost, attainment)."""
    return [i for i, (c, a) in enumerate(points)
            if not any(c2 <= c and a2 >= a and (c2, a2) != (c, a) for c2, a2 in points)]


def plot_pareto(results: Sequence[RunResult], path: str | Path, title: str = "") -> None:
    """Write a PNG of GPU-seconds against SLO attainment, one point per run, the Pareto front
    joined; runs without either figure are left out."""
    runs = [r for r in results if r.meta.get("gpu_seconds") is not None and r.summary.slo_attainment is not None]
    points = [(float(r.meta["gpu_seconds"]), 100 * float(r.summary.slo_attainment or 0.0)) for r in runs]
    fig, ax = plt.subplots(figsize=(8, 6))
    for (cost, share), res in zip(points, runs, strict=True):
        ax.scatter([cost], [share], s=40)
        ax.annotate(res.label, (cost, share), textcoords="offset points", xytext=(5, 4), fontsize="small")
    front = sorted(points[i] for i in pareto_front(points))
    if len(front) > 1:
        ax.plot(*zip(*front, strict=True), linestyle="--", color="grey", label="Pareto front")
        ax.legend(loc="lower right", fontsize="small")
    ax.set(xlabel="GPU-seconds (paid)", ylabel="SLO attainment (% of requests)",
           title=title or "cost against SLO attainment")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
