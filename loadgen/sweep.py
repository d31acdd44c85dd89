"""A rate sweep in one command: the throughput-latency curve of a target.

guidellm's `--rate-type sweep` idea: a synchronous run (one request at a time) measures the
lowest useful rate, a throughput run (every request at once) the highest, and N runs at constant
rates evenly spaced strictly between the two fill in the curve. Every run replays the same
requests (their prompts and lengths); only the arrival times change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import numpy as np

from loadgen.results import RunResult
from loadgen.trace import TraceRequest

SYNCHRONOUS, THROUGHPUT, CONSTANT = "synchronous", "throughput", "constant"


@dataclasses.dataclass(frozen=True)
class SweepRun:
    """One point of a sweep: how requests arrive."""

    kind: str
    """`synchronous`, `throughput` or `constant`."""
    rate: float | None = None
    """Requests per second of a constant run, in the runner's (wall) clock; None otherwise."""

    @property
    def label(self) -> str:
        """`synchronous`, `throughput`, `constant@2.50`: the run's name in tables and plots."""
        return self.kind if self.rate is None else f"{self.kind}@{self.rate:.2f}"

    @property
    def concurrency(self) -> int | None:
        """The cap on requests in flight: 1 for synchronous, none otherwise."""
        return 1 if self.kind == SYNCHRONOUS else None


def between_rates(low: float, high: float, n: int) -> list[float]:
    """`n` rates evenly spaced strictly between `low` and `high` requests per second."""
    if n < 0:
        raise ValueError(f"--sweep must be >= 0 rates, got {n}")
    if not 0 < low < high:  # the target got no faster with more requests in flight
        return []
    return [float(r) for r in np.linspace(low, high, n + 2)[1:-1]]


def retimed(requests: Sequence[TraceRequest], run: SweepRun) -> list[TraceRequest]:
    """`requests` arriving as `run` says: all at 0, or one every 1/rate seconds."""
    step = 0.0 if run.rate is None else 1.0 / run.rate
    return [dataclasses.replace(r, timestamp_s=i * step) for i, r in enumerate(requests)]


async def run_sweep(requests: Sequence[TraceRequest], n: int,
                    replay: Callable[[SweepRun, list[TraceRequest]], Awaitable[RunResult]]) -> list[RunResult]:
    """Synchronous, throughput, then `n` constant rates between their request throughputs;
    `replay(run, requests)` runs one point and returns its result (wall clock)."""
    results = []
    for run in (SweepRun(SYNCHRONOUS), SweepRun(THROUGHPUT)):
        results.append(_tagged(await replay(run, retimed(requests, run)), run))
    low, high = (r.summary.request_throughput_per_s for r in results)
    for rate in between_rates(low, high, n):
        run = SweepRun(CONSTANT, rate)
        results.append(_tagged(await replay(run, retimed(requests, run)), run))
    return results


def _tagged(result: RunResult, run: SweepRun) -> RunResult:
    meta = {**result.meta, "label": run.label, "sweep_kind": run.kind, "sweep_rate": run.rate,
            "request_rate": run.rate if run.rate is not None else float("inf"),
            "max_concurrency": run.concurrency}
    return dataclasses.replace(result, meta=meta)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def sweep_table(results: Sequence[RunResult]) -> str:
    """One row per run, in order of offered load: offered and achieved rates, token
    throughput and TTFT, ITL and E2E percentiles (ms)."""
    from loadgen.report import _table

    rows = []
    for r in sorted(results, key=_offered_order):
        s = r.summary
        rate = r.meta.get("request_rate")
        offered = "-" if rate is None or rate == float("inf") else f"{rate:.2f}"
        rows.append([r.label, offered, f"{s.request_throughput_per_s:.2f}", f"{s.output_throughput_tok_per_s:.1f}",
                     _ms(s.ttft_s.p50), _ms(s.ttft_s.p99), _ms(s.itl_s.p50), _ms(s.e2e_s.p50), _ms(s.e2e_s.p99),
                     f"{s.num_ok}/{s.num_requests}"])
    header = ["run", "offered (req/s)", "achieved (req/s)", "output (tok/s)", "TTFT p50 (ms)",
              "TTFT p99 (ms)", "ITL p50 (ms)", "E2E p50 (ms)", "E2E p99 (ms)", "ok/sent"]
    return _table(header, rows)


def _offered_order(result: RunResult) -> tuple[int, float]:
    kind = result.meta.get("sweep_kind")
    if kind == SYNCHRONOUS:
        return (0, 0.0)
    if kind == THROUGHPUT:
        return (2, 0.0)
    return (1, float(result.meta.get("request_rate") or 0.0))


def plot_sweep(results: Sequence[RunResult], path: str | Path) -> None:
    """Write a PNG of the throughput-latency curve: TTFT and E2E p50 (and p99) against the
    achieved request throughput, one point per run, labelled."""
    from loadgen.plots import plt, seconds_or_ms

    ordered = sorted(results, key=_offered_order)
    xs = [r.summary.request_throughput_per_s for r in ordered]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    for ax, (title, name) in zip(axes, (("TTFT", "ttft_s"), ("E2E", "e2e_s")), strict=True):
        p50 = [getattr(r.summary, name).p50 for r in ordered]
        p99 = [getattr(r.summary, name).p99 for r in ordered]
        scale, unit = seconds_or_ms([v for v in p50 + p99 if v is not None])
        for values, style, label in ((p50, "o-", "p50"), (p99, "s--", "p99")):
            points = [(x, v * scale) for x, v in zip(xs, values, strict=True) if v is not None]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=label)
        for x, v, r in zip(xs, p50, ordered, strict=True):
            if v is not None:
                ax.annotate(r.label, (x, v * scale), textcoords="offset points", xytext=(4, 4), fontsize="x-small")
        ax.set(xlabel="achieved throughput (req/s)", ylabel=f"{title} ({unit})", title=f"{title} against throughput")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
