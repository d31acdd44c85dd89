"""PNG plots of one or more runs: latency CDFs, TTFT over time, replicas against the arrival
rate, and the cost/SLO Pareto plot of several runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from loadgen.results import RunResult  # noqa: E402

_CDFS = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s"))


def _cdf(ax: plt.Axes, values: list[float], label: str) -> None:
    if not values:
        return
    xs = np.sort(np.asarray(values) * 1000)
    ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=label)


def _over_time(ax: plt.Axes, results: Sequence[RunResult]) -> None:
    for res in results:
        ok = [r for r in res.requests if r.ok and r.ttft_s is not None]
        ax.scatter([r.send_time_s for r in ok], [(r.ttft_s or 0.0) * 1000 for r in ok], s=6, label=res.label)
    ax.set(xlabel="send time (s)", ylabel="TTFT (ms)", title="TTFT over time")
    with_replicas = [r for r in results if r.replicas]
    if with_replicas:
        twin = ax.twinx()
        for res in with_replicas:
            times, counts = zip(*res.replicas, strict=True)
            twin.step(times, counts, where="post", linestyle="--", label=f"{res.label} replicas")
        twin.set_ylabel("ready replicas")
        twin.legend(loc="upper right", fontsize="small")


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
            times, counts = zip(*res.replicas, strict=True)
            twin.step(times, counts, where="post", label=res.label)
    twin.set_ylabel("ready replicas")
    twin.legend(loc="upper right", fontsize="small")
    ax.legend(loc="upper left", fontsize="small")


def plot_runs(results: Sequence[RunResult], path: str | Path) -> None:
    """Write a PNG with a CDF per latency, TTFT over send time and ready replicas against the
    arrival rate, one series per run."""
    fig, axes = plt.subplots(2, 3, figsize=(18, 8))
    for ax, (label, name) in zip(axes.flat, _CDFS, strict=False):
        for res in results:
            _cdf(ax, [getattr(r, name) for r in res.requests if r.ok and getattr(r, name) is not None], res.label)
        ax.set(xlabel=f"{label} (ms)", ylabel="fraction of requests", title=f"{label} CDF")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    _over_time(axes.flat[3], results)
    axes.flat[3].legend(loc="upper left", fontsize="small")
    _replicas_vs_rate(axes.flat[4], results)
    axes.flat[5].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
