"""The routing-quality tables (one per workload) and plot, from bench/peers/quality.py's JSON rows."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from bench.peers.report import NOISY, cell, markdown_table, spread  # noqa: E402


def _runs(records: list[dict], workload: str, router: str) -> list[dict]:
    return [r for r in records if r["workload"] == workload and r["router"] == router]


def split(per_engine: list[int]) -> str:
    """Share of the prompt tokens each engine was asked for, in percent: '25/25/25/25'."""
    total = sum(per_engine)
    return "/".join(f"{100 * q / total:.0f}" for q in per_engine) if total else "–"


def table(records: list[dict], workload: str) -> str:
    """One row per router: median [min–max] over rounds."""
    routers = list(dict.fromkeys(r["router"] for r in records if r["workload"] == workload))
    head = ["router", "TTFT p50 ms", "TTFT p99 ms", "E2E p99 ms", "prefix-cache hit %", "goodput req/s",
            "ok / sent", "engine split % (round 1)", "router CPU s", "others' cores"]
    rows = []
    for name in routers:
        runs = _runs(records, workload, name)

        def c(key: str, d: int = 0, scale: float = 1000.0, runs: list[dict] = runs) -> str:
            return cell([r[key] for r in runs], d, scale)
        noisy = NOISY if any(r["noisy"] for r in runs) else ""
        rows.append([name, c("ttft_p50_s"), c("ttft_p99_s"), c("e2e_p99_s"), c("engine_hit_rate", 1, 100.0),
                     c("goodput_per_s", 2, 1.0), " ; ".join(f"{r['ok']}/{r['sent']}" for r in runs),
                     split(runs[0]["per_engine"]), c("router_cpu_s", 2, 1.0),
                     f"{max(r['other_cores'] for r in runs):.2f}{noisy}"])
    return markdown_table(head, rows)


_PANELS = (("ttft_p99_s", "TTFT p99 (ms, log)", 1000.0), ("engine_hit_rate", "prefix-cache hit %", 100.0),
           ("goodput_per_s", "goodput (req/s)", 1.0))


def plot(records: list[dict], workloads: list[str], path: Path) -> None:
    """Rows = workloads, columns = TTFT p99, hit rate, goodput; whiskers = min–max over rounds."""
    fig, axes = plt.subplots(len(workloads), len(_PANELS), figsize=(15, 3.2 * len(workloads)), squeeze=False)
    for row, wl in zip(axes, workloads, strict=True):
        routers = list(dict.fromkeys(r["router"] for r in records if r["workload"] == wl))
        for ax, (key, title, scale) in zip(row, _PANELS, strict=True):
            stats = [spread(r[key] * scale if r[key] is not None else None for r in _runs(records, wl, n))
                     or (np.nan,) * 3 for n in routers]
            med = np.array([s[0] for s in stats])
            err = np.array([[s[0] - s[1] for s in stats], [s[2] - s[0] for s in stats]])
            colors = ["tab:blue" if n.startswith("flotilla") else "tab:orange" for n in routers]
            ax.barh(routers, med, xerr=err, color=colors, ecolor="black", capsize=3)
            ax.invert_yaxis()
            if "log" in title:  # one saturated router would flatten the rest
                ax.set_xscale("log")
            ax.set_title(f"{wl}: {title}", fontsize=10)
            ax.tick_params(labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
