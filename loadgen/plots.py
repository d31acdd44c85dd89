"""PNG plots of one or more runs: latency CDFs and TTFT over time (with replicas when known)."""

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


def plot_runs(results: Sequence[RunResult], path: str | Path) -> None:
    """Write a PNG with a CDF per latency and TTFT over send time, one series per run."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for ax, (label, name) in zip(axes.flat, _CDFS, strict=False):
        for res in results:
            _cdf(ax, [getattr(r, name) for r in res.requests if r.ok and getattr(r, name) is not None], res.label)
        ax.set(xlabel=f"{label} (ms)", ylabel="fraction of requests", title=f"{label} CDF")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    _over_time(axes.flat[3], results)
    axes.flat[3].legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
