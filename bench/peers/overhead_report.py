"""The overhead table and plot, from the per-phase JSON rows of bench/peers/overhead.py."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from bench.peers.report import NOISY, added, cell, markdown_table, spread  # noqa: E402


def _rows(records: list[dict], target: str, phase: str) -> list[dict]:
    return [r for r in records if r["target"] == target and r["phase"] == phase]


def _col(records: list[dict], target: str, phase: str, key: str) -> list[float]:
    return [r[key] for r in _rows(records, target, phase)]


def targets_of(records: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["target"] for r in records))


def _noise(records: list[dict], target: str) -> str:
    rows = [r for r in records if r["target"] == target]
    worst = max(r["other_cores"] for r in rows)
    mark = NOISY if any(r["noisy"] for r in rows) else ""
    return f"{worst:.2f}{mark} ({sum(r['attempts'] - 1 for r in rows)})"


def table(records: list[dict], rates: dict[str, float]) -> str:
    """One row per target; each figure is the median over rounds with the [min–max] spread."""
    direct = "direct"
    head = ["target", f"p50 / p99 ms @ {rates['low']:g} req/s", "added p50 ms",
            f"p50 / p99 ms @ {rates['high']:g} req/s", "added p50 ms",
            f"stream TTFB p50 / p99 ms @ {rates['stream']:g} req/s", "added TTFB p50 ms",
            f"router CPU ms/req @ {rates['low']:g} ; {rates['high']:g} ; stream {rates['stream']:g}",
            "max req/s (wrk)", "router CPU ms/req @ max", "errors", "others' cores, worst phase (repeats)"]
    rows = []
    for t in targets_of(records):
        def c(phase: str, key: str, d: int = 2, t: str = t) -> str:
            return cell(_col(records, t, phase, key), d)

        def a(phase: str, t: str = t) -> str:
            return "–" if t == direct else added(_col(records, t, phase, "p50_ms"), _col(records, direct, phase, "p50_ms"))
        cpu = "–" if t == direct else " ; ".join(c(p, "cpu_ms_per_req", 3) for p in ("low", "high", "stream"))
        rows.append([t, f"{c('low', 'p50_ms')} / {c('low', 'p99_ms', 1)}", a("low"),
                     f"{c('high', 'p50_ms')} / {c('high', 'p99_ms', 1)}", a("high"),
                     f"{c('stream', 'p50_ms')} / {c('stream', 'p99_ms', 1)}", a("stream"), cpu,
                     c("max", "rate_rps", 0), "–" if t == direct else c("max", "cpu_ms_per_req", 3),
                     str(sum(r["errors"] for r in records if r["target"] == t)), _noise(records, t)])
    return markdown_table(head, rows)


REFERENCE = "vllm-router round_robin"
"""The router the max-rate bar is set against (issue 21)."""


def paired(records: list[dict], reference: str = REFERENCE) -> str:
    """Each router's max req/s as a share of `reference`'s in the same round. Within a round the
    targets run back to back, so a slow spell of the machine that spans a round cancels here,
    while the table's medians of each target over rounds keep it."""
    ref = {r["round"]: r["rate_rps"] for r in _rows(records, reference, "max")}
    if not ref:
        return ""
    rows = []
    for t in targets_of(records):
        if t in ("direct", reference):
            continue
        shares = [100 * r["rate_rps"] / ref[r["round"]] for r in _rows(records, t, "max")
                  if ref.get(r["round"])]
        if shares:
            rows.append([t, cell(shares, 0), f"{sum(s >= 100 for s in shares)} of {len(shares)}"])
    head = ["target", f"max req/s, % of {reference}'s in the same round", "rounds at or above it"]
    return markdown_table(head, rows)


def tables(records: list[dict], rates: dict[str, float]) -> str:
    """The overhead table, then the paired max-rate table when the reference ran."""
    pair = paired(records)
    return table(records, rates) + (f"\n\n{pair}" if pair else "")


_PANELS = (("high", "p50_ms", "added p50 latency @ high rate (ms)", True),
           ("stream", "p50_ms", "added stream TTFB p50 (ms)", True),
           ("high", "cpu_ms_per_req", "router CPU ms per request @ high rate", False),
           ("max", "rate_rps", "max req/s (wrk)", False))


def plot(records: list[dict], path: Path) -> None:
    """Four bar panels (log scale: LiteLLM is orders of magnitude off), whiskers = min–max over rounds."""
    names = targets_of(records)
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    for ax, (phase, key, title, minus_direct) in zip(axes.flat, _PANELS, strict=True):
        base = spread(_col(records, "direct", phase, key))[0] if minus_direct else 0.0
        shown = [n for n in names if not (n == "direct" and (minus_direct or key == "cpu_ms_per_req"))]
        stats = [spread(_col(records, n, phase, key)) or (np.nan,) * 3 for n in shown]
        med = np.array([max(s[0] - base, 1e-3) for s in stats])
        err = np.array([[max(s[0] - s[1], 0) for s in stats], [max(s[2] - s[0], 0) for s in stats]])
        colors = ["tab:blue" if n.startswith("flotilla") else "tab:gray" if n in ("direct", "nginx", "aiohttp floor")
                  else "tab:orange" for n in shown]
        ax.barh(shown, med, xerr=err, color=colors, ecolor="black", capsize=3)
        ax.set_xscale("log")
        ax.set_title(title)
        ax.invert_yaxis()
        for y, v in enumerate(med):
            ax.text(v, y, f" {v:,.3g}", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
