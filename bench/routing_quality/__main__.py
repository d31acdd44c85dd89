"""`python -m bench.routing_quality`: every routing policy on long trace windows through 8 simulated
vLLM replicas (Llama 3.1 8B on H100, the KV cache the capacity model gives), in virtual time.

Each cell (workload x policy) is one `flotilla sim` run, stored under OUT/cells/ as it finishes, so
an interrupted grid resumes where it stopped (`--fresh` reruns everything). The results go to
OUT/routing_quality.json, a markdown table and a PNG, and, unless `--no-write`, into
docs/benchmarks.md and docs/img/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench.peers.report import write_block
from bench.routing_quality import report
from bench.routing_quality.grid import (
    REPO,
    WORKLOADS,
    Cell,
    FleetConfig,
    Workload,
    ideal_hit_rate,
    is_peer,
    policies,
    run_cell,
    workload,
)
from sim.fleet import KV_EVENTS_DELAY_S

QUICK_REQUESTS = 40
"""Requests per workload in --quick mode: enough to exercise every cell, a few seconds each."""
FOCUS_WORKLOAD = "mooncake-conversation"


def _split(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.routing_quality", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", help=f"comma list (default all: {', '.join(w.name for w in WORKLOADS)})")
    p.add_argument("--policies", help="comma list of routing policy specs (default every registered policy)")
    p.add_argument("--also", help="comma list of policy specs run besides --policies (variants: NAME:key=value)")
    p.add_argument("--quick", action="store_true", help=f"first {QUICK_REQUESTS} requests of each workload")
    p.add_argument("--max-requests", type=int, help="cut every workload to its first N requests")
    p.add_argument("--replicas", type=int, default=FleetConfig.replicas)
    p.add_argument("--kv-events-delay", type=float, metavar="S",
                   help="seconds from an engine step to its KV events reaching the index (default: the simulator's)")
    p.add_argument("--workers", type=int, default=1,
                   help="cells simulated in parallel processes (default 1: the machine is shared)")
    p.add_argument("--fresh", action="store_true", help="rerun cells already stored under OUT/cells")
    p.add_argument("--stored-only", action="store_true",
                   help="run nothing: report the cells stored under OUT/cells and list the missing ones")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "routing_quality")
    p.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    p.add_argument("--img", type=Path, default=REPO / "docs" / "img")
    p.add_argument("--no-write", action="store_true", help="leave docs/ alone")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def _cell_path(out: Path, wl: str, policy: str) -> Path:
    return out / "cells" / f"{wl}--{policy.replace(':', '_').replace(',', '_').replace('=', '-')}.json"


def _stored(path: Path, cfg: FleetConfig) -> dict[str, Any] | None:
    if not path.exists():
        return None
    row: dict[str, Any] = json.loads(path.read_text())
    return row if row.get("config") == cfg.key() and not row.get("error") else None


def _run_one(wl: Workload, policy: str, cfg: FleetConfig) -> Cell:
    return run_cell(wl, policy, cfg)


def run_grid(cells: list[tuple[Workload, str]], cfg: FleetConfig, out: Path, workers: int,
             quiet: bool, fresh: bool, stored_only: bool = False) -> list[dict[str, Any]]:
    """Every cell, stored ones reused; returns the JSON rows in grid order (with `stored_only`,
    the stored cells only)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    todo = []
    for wl, policy in cells:
        stored = None if fresh else _stored(_cell_path(out, wl.name, policy), cfg)
        if stored is not None:
            rows[(wl.name, policy)] = stored
        else:
            todo.append((wl, policy))
    if stored_only:
        return [rows[(wl.name, p)] for wl, p in cells if (wl.name, p) in rows]
    sizes = {wl.name: wl.count(cfg.max_requests) for wl, _ in todo}
    (out / "cells").mkdir(parents=True, exist_ok=True)
    with tqdm(total=sum(sizes[wl.name] for wl, _ in todo), unit="req", disable=quiet, file=sys.stderr,
              mininterval=2.0, desc=f"{len(todo)} cells ({len(cells) - len(todo)} stored)") as bar:
        def done(cell: Cell) -> None:
            row = asdict(cell)
            rows[(cell.workload, cell.policy)] = row
            _cell_path(out, cell.workload, cell.policy).write_text(json.dumps(row, indent=1) + "\n")
            if cell.error:
                tqdm.write(f"{cell.workload} / {cell.policy}: {cell.error}", file=sys.stderr)

        if workers <= 1:
            for wl, policy in todo:
                bar.set_postfix_str(f"{wl.name} / {policy}")
                start = bar.n
                done(run_cell(wl, policy, cfg, bar.update))
                bar.update(start + sizes[wl.name] - bar.n)  # the last partial tick, or a failed cell's rest
        else:
            # the largest workloads first, so the last cells to finish are short ones
            todo.sort(key=lambda c: -sizes[c[0].name])
            with ProcessPoolExecutor(max_workers=workers) as pool:
                pending = {pool.submit(_run_one, wl, policy, cfg): wl for wl, policy in todo}
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        bar.update(sizes[pending.pop(fut).name])
                        done(fut.result())
    return [rows[(wl.name, policy)] for wl, policy in cells]


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.machine()) if Path("/proc/cpuinfo").exists() else "?"
    return f"{os.cpu_count()} CPUs ({model}), Python {platform.python_version()}"


def _verdict(ours: float, theirs: float, low: bool) -> str:
    """ahead / tied / behind, ties judged at the precision the table prints (3 significant digits)."""
    if f"{ours:.3g}" == f"{theirs:.3g}":
        return "tied"
    return "ahead" if (ours < theirs) == low else "behind"


def findings(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's two questions, answered from the rows as they stand."""
    lines = []
    by = {(r["workload"], r["policy"]): r for r in rows if not r.get("error")}
    pp, pa = by.get((FOCUS_WORKLOAD, "precise-prefix")), by.get((FOCUS_WORKLOAD, "prefix-aware"))
    if pp and pa:
        verdict = "higher" if pp["hit_rate"] > pa["hit_rate"] else "not higher"
        lines.append(f"- {FOCUS_WORKLOAD}: `precise-prefix` hit rate {100 * pp['hit_rate']:.1f} % against "
                     f"`prefix-aware` {100 * pa['hit_rate']:.1f} %: {verdict}.")
    units = {"ttft_p99_s": (1e3, "ms", 0), "goodput_per_s": (1.0, "req/s", 2)}
    shipped = [r for r in rows if not r.get("error") and ":" not in r["policy"]]  # variants are not the question
    for wl in dict.fromkeys(r["workload"] for r in rows):
        ours = [r for r in shipped if r["workload"] == wl and r["family"] == "flotilla"]
        peers = [r for r in shipped if r["workload"] == wl and r["family"] == "peer"]
        if not ours or not peers:
            continue
        parts = []
        for key, label, low in (("ttft_p99_s", "TTFT p99", True), ("goodput_per_s", "goodput", False)):
            pick = min if low else max
            best, peer = pick(ours, key=lambda r, k=key: r[k]), pick(peers, key=lambda r, k=key: r[k])
            scale, unit, digits = units[key]
            parts.append(f"{label} {_verdict(best[key], peer[key], low)}: Flotilla's best `{best['policy']}` "
                         f"{best[key] * scale:,.{digits}f} {unit}, the peers' best `{peer['policy']}` "
                         f"{peer[key] * scale:,.{digits}f} {unit}")
        lines.append(f"- {wl}: " + "; ".join(parts) + ".")
    return lines


def markdown(rows: list[dict[str, Any]], cfg: FleetConfig, ideal: dict[str, float | None], argv: list[str],
             image: str, missing: Sequence[tuple[str, str]] = ()) -> str:
    slo = cfg.slo
    parts = [
        "## Routing quality at scale (simulated)", "",
        f"`python -m bench.routing_quality{''.join(' ' + a for a in argv if a != '--stored-only')}`"
        + (" (cells run as they fit and stored under bench/out/routing_quality/cells; this page was then "
           "written from them with `--stored-only`)" if "--stored-only" in argv else ""), "",
        f"Machine: {machine()}. Every cell is one `flotilla sim` run in virtual time: {cfg.replicas} replicas of "
        f"the look-alike vLLM engine ({cfg.model} on {cfg.gpu}, KV blocks from the capacity model at "
        "`--gpu-memory-utilization 0.9`, prefix caching on, sha256 block hashes), the real routing policy "
        f"objects, engine metrics scraped every {cfg.scrape_interval_s} s (the proxy's default), KV events "
        "delivered to a policy's index "
        + f"{1e3 * (KV_EVENTS_DELAY_S if cfg.kv_events_delay_s is None else cfg.kv_events_delay_s):g} ms"
        + " after the engine step that made them (the simulator's `--kv-events-delay`). A policy spec with "
        "parameters (`NAME:key=value`) is a variant run with `--also`, not the policy as shipped; the "
        "answers below leave variants out.",
        f"Goodput counts requests with TTFT ≤ {slo.ttft_s:g} s and TPOT ≤ {1e3 * (slo.tpot_s or 0):g} ms "
        "(H100 time), per second of the run; *SLO met* is their share. Prefix hit is prompt tokens served "
        "from the engines' prefix caches over all prompt tokens; *prefill max/mean* is the most prompt "
        "tokens any replica computed over the mean (1.00: even). Bold: best of the column. "
        "Flotilla's policies in blue, the peers' algorithms in orange."
        + (f" **Every workload is cut to its first {cfg.max_requests} requests** (`--quick` / `--max-requests`)."
           if cfg.max_requests else ""), "",
        f"![routing quality at scale]({image})", ""]
    for wl in dict.fromkeys(r["workload"] for r in rows):
        w = workload(wl)
        ideal_text = f"; ideal hit rate (one unbounded cache) {100 * ideal[wl]:.1f} %" if ideal.get(wl) else ""
        parts += [f"**{wl}**: {w.note}{ideal_text}.", "", report.table(rows, wl), ""]
    if missing:
        parts += [f"Not run ({len(missing)} cells): " + "; ".join(
            f"{wl}: {', '.join(f'`{p}`' for w, p in missing if w == wl)}" for wl in dict.fromkeys(w for w, _ in missing))
            + ".", ""]
    if lines := findings(rows):
        parts += ["Read from the rows above:", "", *lines, ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    names = _split(args.workloads) or [w.name for w in WORKLOADS]
    try:
        wls = [workload(n) for n in names]
        pols = list(dict.fromkeys((_split(args.policies) or policies()) + (_split(args.also) or [])))
        for p in pols:
            is_peer(p)  # unknown names fail here, before any run
    except (ValueError, KeyError) as exc:
        print(f"bench.routing_quality: error: {exc}", file=sys.stderr)
        return 2
    cfg = FleetConfig(replicas=args.replicas, kv_events_delay_s=args.kv_events_delay,
                      max_requests=QUICK_REQUESTS if args.quick else args.max_requests)
    grid = [(w, p) for w in wls for p in pols]
    rows = run_grid(grid, cfg, args.out, args.workers, args.quiet, args.fresh, args.stored_only)
    have = {(r["workload"], r["policy"]) for r in rows}
    missing = [(w.name, p) for w, p in grid if (w.name, p) not in have]
    ideal = {w.name: ideal_hit_rate(w, cfg.max_requests) for w in wls}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "routing_quality.json").write_text(json.dumps(
        {"machine": machine(), "config": cfg.key(), "ideal_hit_rate": ideal, "cells": rows}, indent=1) + "\n")
    png = args.out / "routing_quality.png"
    shown = [w.name for w in wls if any(r["workload"] == w.name for r in rows)]
    report.plot(rows, shown, png)
    text = markdown(rows, cfg, ideal, argv, png.name, missing)
    (args.out / "routing_quality.md").write_text(text + "\n")
    if not args.no_write:
        args.img.mkdir(parents=True, exist_ok=True)
        report.plot(rows, shown, args.img / "routing-quality.png")
        doc_text = markdown(rows, cfg, ideal, argv, os.path.relpath(args.img / "routing-quality.png",
                                                                    args.doc.parent), missing)
        write_block(args.doc, "routing-quality", doc_text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
