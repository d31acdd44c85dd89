"""The routing-quality tables (one per workload) and plot, from the grid's cells."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402

from bench.peers.report import markdown_table  # noqa: E402

Row = dict[str, Any]


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1e3:,.0f}"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _num(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def _cells(cells: Sequence[Row], workload: str) -> list[Row]:
    return [c for c in cells if c["workload"] == workload]


def table(cells: Sequence[Row], workload: str) -> str:
    """One row per policy; the best value of each column among policies that finished is bold."""
    rows = _cells(cells, workload)
    good = [c for c in rows if not c.get("error")]
    best = {k: (min if low else max)((c[k] for c in good if c[k] is not None), default=None)
            for k, low in (("ttft_p50_s", True), ("ttft_p99_s", True), ("e2e_p90_s", True),
                           ("goodput_per_s", False), ("hit_rate", False), ("prefill_max_over_mean", True))}

    def fmt(c: Row, key: str, text: str) -> str:
        return f"**{text}**" if c[key] is not None and c[key] == best[key] else text

    head = ["policy", "kind", "TTFT p50 ms", "TTFT p99 ms", "E2E p90 ms", "goodput req/s", "SLO met %",
            "prefix hit %", "prefill max/mean", "ok / requests"]
    out = []
    for c in rows:
        if c.get("error"):
            out.append([c["policy"], c["family"], f"failed: {c['error']}", *["–"] * 7])
            continue
        kind = f"{c['family']}, variant" if ":" in c["policy"] else c["family"]
        out.append([c["policy"], kind, fmt(c, "ttft_p50_s", _ms(c["ttft_p50_s"])),
                    fmt(c, "ttft_p99_s", _ms(c["ttft_p99_s"])), fmt(c, "e2e_p90_s", _ms(c["e2e_p90_s"])),
                    fmt(c, "goodput_per_s", _num(c["goodput_per_s"])), _pct(c["slo_attained"]),
                    fmt(c, "hit_rate", _pct(c["hit_rate"])),
                    fmt(c, "prefill_max_over_mean", _num(c["prefill_max_over_mean"])),
                    f"{c['ok']:,} / {c['requests']:,}"])
    return markdown_table(head, out)


_PANELS = (("ttft_p99_s", "TTFT p99 (ms, log)", 1000.0), ("goodput_per_s", "goodput (req/s)", 1.0),
           ("hit_rate", "prefix hit %", 100.0), ("prefill_max_over_mean", "prefill max/mean", 1.0))


def plot(cells: Sequence[Row], workloads: Sequence[str], path: Path) -> None:
    """Rows = workloads, columns = TTFT p99, goodput, hit rate, prefill imbalance; peers in orange."""
    fig, axes = plt.subplots(len(workloads), len(_PANELS), figsize=(18, 0.3 * 20 * len(workloads) / 2 + 1),
                             squeeze=False)
    for row, wl in zip(axes, workloads, strict=True):
        rows = [c for c in _cells(cells, wl) if not c.get("error")]
        names = [c["policy"] for c in rows]
        colors = ["tab:orange" if c["family"] == "peer" else "tab:blue" for c in rows]
        for ax, (key, title, scale) in zip(row, _PANELS, strict=True):
            values = [(c[key] or 0.0) * scale for c in rows]
            ax.barh(names, values, color=colors)
            ax.invert_yaxis()
            positive = [v for v in values if v > 0]
            log = "log" in title and positive and max(positive) > 20 * min(positive)
            if log:  # one saturated policy would flatten the rest
                ax.set_xscale("log")
            elif not positive:
                ax.text(0.5, 0.5, "0 for every policy", transform=ax.transAxes, ha="center", fontsize=9)
            ax.set_title(f"{wl}: {title.replace(', log', '') if not log else title}", fontsize=10)
            ax.tick_params(labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
