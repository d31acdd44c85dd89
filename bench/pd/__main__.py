"""`python -m bench.pd`: colocated against disaggregated prefill/decode on three public traces.

For each GPU budget (`--gpus 4 8`) and trace (Mooncake conversation, Azure conversation, Azure
code; the slices in tests/data/traces) its first requests are replayed (the slice lengths are for
4 GPUs; a larger budget, offered about proportionally more, replays proportionally more requests so
its arrivals span as long; `--requests` scales them all), their arrival times scaled so the
offered rate is the goodput `flotilla plan pd` predicts (mean prompt and output lengths of the
slice, the trace's SLOs, the budget): the colocated fleet gets its own predicted goodput, and
every prefill:decode split gets, on identical arrivals, the best split's. Every link of --links
is swept at the smallest budget; larger budgets (more splits, more runs) test the plan on
--plan-link alone.
Goodput is the offered rate times the share of requests within both SLOs; the simulator's best
split is the one with the highest goodput (ties: the most SLO headroom). It prints a progress line per run (done,
total, elapsed, ETA), then the table of docs/benchmarks.md, and writes bench/out/pd.json and a
PNG plot.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fake_engines.factory import build_engine
from fake_engines.factory.catalogue import catalogue_of
from fake_engines.pd_capacity import RequestShape, replica_rates, splits
from loadgen.readers import read_trace
from loadgen.results import RunResult, Slo
from loadgen.trace import TraceRequest
from sim.build import EngineSpec
from sim.pd import DEFAULT_PREFILL_POLICY, PdFleet, simulate_pd
from sim.run import simulate

REPO = Path(__file__).resolve().parents[2]
BASE_GPUS = 4
"""The budget the slice lengths of CASES are for."""
TRACES_DIR = REPO / "tests" / "data" / "traces"


@dataclass(frozen=True)
class TraceCase:
    name: str
    file: str
    slo: Slo
    """DistServe-style per-application SLOs: chat tolerates a longer TTFT on long contexts,
    code completion wants its first token fast."""
    requests: int
    """Slice length: its arrivals must span several request lifetimes at the offered rate, or the
    decode pool never fills and the run measures a burst's transient, not the fleet's capacity."""


CASES = (
    TraceCase("mooncake-conversation", "mooncake_conversation_trace.first30min.jsonl", Slo(ttft_s=2.0, tpot_s=0.05),
              300),
    TraceCase("azure-conversation", "AzureLLMInferenceTrace_conv.before1845.csv", Slo(ttft_s=0.5, tpot_s=0.05), 2000),
    TraceCase("azure-code", "AzureLLMInferenceTrace_code.before1845.csv", Slo(ttft_s=0.5, tpot_s=0.05), 600),
)


def _slice(case: TraceCase, requests: int) -> list[TraceRequest]:
    return list(itertools.islice(read_trace(str(TRACES_DIR / case.file)), requests))


def _rescaled(reqs: Sequence[TraceRequest], rate_rps: float) -> list[TraceRequest]:
    """The slice's arrivals stretched or squeezed to a mean of `rate_rps` (burstiness kept)."""
    t0 = reqs[0].timestamp_s
    span = reqs[-1].timestamp_s - t0
    factor = (len(reqs) - 1) / rate_rps / span if span > 0 else 0.0
    return [dataclasses.replace(r, timestamp_s=(r.timestamp_s - t0) * factor) for r in reqs]


def _goodput(result: RunResult, rate: float) -> float:
    return rate * (result.summary.slo_attainment or 0.0)


def _headroom(result: RunResult, slo: Slo) -> float:
    s = result.summary
    return -((s.ttft_s.p90 or 1e9) / (slo.ttft_s or 1) + (s.tpot_s.p90 or 1e9) / (slo.tpot_s or 1))


class Progress:
    """One line per run on stderr: done/total, elapsed, ETA."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, time.monotonic()

    def step(self, what: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        print(f"[{self.done}/{self.total}] {what}  elapsed {elapsed:.0f} s, ETA {eta:.0f} s", file=sys.stderr, flush=True)


def run_case(case: TraceCase, spec: EngineSpec, gpus: int, links: Sequence[str], requests: float,
             progress: Progress, plan_link: str) -> dict[str, Any]:
    reqs = _slice(case, max(2, round(case.requests * requests * max(1.0, gpus / BASE_GPUS))))
    shape = RequestShape(round(sum(r.input_length or 0 for r in reqs) / len(reqs)),
                         max(2, round(sum(r.output_length for r in reqs) / len(reqs))),
                         case.slo.ttft_s or 1.0, case.slo.tpot_s or 1.0)
    engine = build_engine(spec.group().engine_config())
    plans = {link: replica_rates(engine, catalogue_of(()).link(link), shape) for link in links}
    predicted = {link: splits(rates, gpus) for link, rates in plans.items()}
    colocated_pred = gpus * plans[plan_link].colocated_rps
    # each kind of fleet is offered what the plan says it sustains: the colocated fleet its
    # predicted goodput, every split (over every link) the best split's, on identical arrivals
    col_rate, rate = colocated_pred, predicted[plan_link][0].goodput_rps
    col_arrivals, arrivals = _rescaled(reqs, col_rate), _rescaled(reqs, rate)
    colocated = simulate(lambda: col_arrivals, spec, gpus, DEFAULT_PREFILL_POLICY, slo=case.slo)
    progress.step(f"{case.name} colocated x{gpus}")
    rows: dict[str, Any] = {"colocated": {"goodput_rps": _goodput(colocated, col_rate), "offered_rps": col_rate,
                                          "slo_attainment": colocated.summary.slo_attainment,
                                          "ttft_p90_s": colocated.summary.ttft_s.p90,
                                          "tpot_p90_s": colocated.summary.tpot_s.p90,
                                          "predicted_rps": colocated_pred}}
    for link in links:
        runs = []
        for p in range(1, gpus):
            result = simulate_pd(lambda: arrivals, spec, PdFleet(p, gpus - p, kv_link=link), slo=case.slo)
            runs.append((p, result))
            progress.step(f"{case.name} P/D {p}:{gpus - p} {link}")
        best_p, best = max(runs, key=lambda pr: (round(_goodput(pr[1], rate), 6), _headroom(pr[1], case.slo)))
        rows[link] = {
            "splits": {f"{p}:{gpus - p}": {"goodput_rps": _goodput(r, rate), "slo_attainment": r.summary.slo_attainment,
                                          "ttft_p90_s": r.summary.ttft_s.p90, "tpot_p90_s": r.summary.tpot_s.p90,
                                          "kv_pull_mean_s": r.meta["kv_transfer"]["mean_s"]} for p, r in runs},
            "sim_best": f"{best_p}:{gpus - best_p}", "sim_best_goodput_rps": _goodput(best, rate),
            "plan_best": f"{predicted[link][0].prefill}:{predicted[link][0].decode}",
            "plan_best_rps": predicted[link][0].goodput_rps,
            "plan_predicted_rps": {f"{s.prefill}:{s.decode}": s.goodput_rps for s in predicted[link]},
        }
    return {"trace": case.name, "requests": len(reqs), "input_len_mean": shape.input_len,
            "output_len_mean": shape.output_len, "ttft_slo_s": case.slo.ttft_s, "tpot_slo_s": case.slo.tpot_s,
            "offered_rps": rate, "colocated_offered_rps": col_rate, "gpus": gpus, "rows": rows}


def table(cases: Sequence[dict[str, Any]], links: Sequence[str], plan_link: str) -> str:
    lines = ["| trace (mean in/out tokens, SLOs) | offered req/s: colocated, P/D | colocated goodput/GPU (SLO met) | "
             + " | ".join(f"best P/D {link}: split, goodput/GPU (SLO met)" for link in links)
             + f" | plan's best ({plan_link}) | sim's best ({plan_link}) |",
             "|---|---|---|" + "---|" * len(links) + "---|---|"]
    for c in cases:
        g, rows = c["gpus"], c["rows"]
        cells = [f"{rows[link]['sim_best']}: {rows[link]['sim_best_goodput_rps'] / g:.2f} "
                 f"({100 * (rows[link]['splits'][rows[link]['sim_best']]['slo_attainment'] or 0):.0f}%)" for link in links]
        col = rows["colocated"]
        agree = "agree" if rows[plan_link]["plan_best"] == rows[plan_link]["sim_best"] else "differ"
        lines.append(f"| {c['trace']} ({c['input_len_mean']}/{c['output_len_mean']}, TTFT {c['ttft_slo_s']:g} s, "
                     f"TPOT {1e3 * c['tpot_slo_s']:g} ms) | {c['colocated_offered_rps']:.1f}, {c['offered_rps']:.1f} | "
                     f"{col['goodput_rps'] / g:.2f} ({100 * (col['slo_attainment'] or 0):.0f}%) | " + " | ".join(cells)
                     + f" | {rows[plan_link]['plan_best']} | {rows[plan_link]['sim_best']} ({agree}) |")
    return "\n".join(lines)


def agreement_table(cases: Sequence[dict[str, Any]], plan_link: str) -> str:
    """Per budget and trace: the plan's and the simulator's best split, and the plan's predicted
    goodput of its split against what the simulator measured for it (offered at that prediction,
    so the simulator can only confirm it or fall short)."""
    lines = [f"| GPUs | trace | plan's best ({plan_link}) | sim's best | agree | plan's split: predicted, simulated "
             "req/s (gap) |", "|---|---|---|---|---|---|"]
    for c in cases:
        r = c["rows"][plan_link]
        sim = r["splits"][r["plan_best"]]["goodput_rps"]
        gap = 100 * (sim / r["plan_best_rps"] - 1) if r["plan_best_rps"] else 0.0
        lines.append(f"| {c['gpus']} | {c['trace']} | {r['plan_best']} | {r['sim_best']} | "
                     f"{'yes' if r['plan_best'] == r['sim_best'] else 'no'} | "
                     f"{r['plan_best_rps']:.1f}, {sim:.1f} ({gap:+.0f}%) |")
    return "\n".join(lines)


def plot(cases: Sequence[dict[str, Any]], links: Sequence[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    names = ["colocated", *(f"P/D {link}" for link in links)]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [(c["rows"]["colocated"]["goodput_rps"] if name == "colocated"
                   else c["rows"].get(name[4:], {}).get("sim_best_goodput_rps", 0.0)) / c["gpus"] for c in cases]
        ax.bar([k + i * width for k in range(len(cases))], values, width, label=name)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(cases))],
                  [f"{c['trace']}\n{c['gpus']} GPUs" for c in cases], fontsize=7)
    ax.set_yscale("log")  # the traces differ by 40x
    ax.set_ylabel("goodput per GPU (req/s within both SLOs, log)")
    ax.set_title("colocated vs best prefill:decode split (simulated, llama-3.1-8b on H100)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pd", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=float, default=1.0,
                   help="scale of each trace's slice (default 1: 300 Mooncake, 2000 Azure conversation, 600 "
                        "Azure code requests)")
    p.add_argument("--gpus", type=int, nargs="+", default=[4, 8], metavar="BUDGET",
                   help="GPU budgets, each a run of every trace (default 4 8)")
    p.add_argument("--links", default="nvlink,ib400,eth100", help="KV links compared (default nvlink,ib400,eth100)")
    p.add_argument("--plan-link", default="ib400", help="the link plan and simulator are compared on (default ib400)")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--gpu", default="h100")
    p.add_argument("--traces", default=",".join(c.name for c in CASES), help="traces to run (default all three)")
    p.add_argument("--json", default=str(REPO / "bench" / "out" / "pd.json"), help="where the figures go")
    p.add_argument("--plot", default=str(REPO / "docs" / "img" / "pd_goodput.png"), help="PNG plot ('' for none)")
    args = p.parse_args(argv)
    links = [x for x in args.links.split(",") if x]
    if args.plan_link not in links:
        links.append(args.plan_link)
    cases = [c for c in CASES if c.name in args.traces.split(",")]
    spec = EngineSpec(model=args.model, gpu=args.gpu)
    budgets = sorted(set(args.gpus))
    swept = {g: links if g == budgets[0] else [args.plan_link] for g in budgets}
    progress = Progress(sum(len(cases) * (1 + len(swept[g]) * (g - 1)) for g in budgets))
    results = []
    for g in budgets:
        done = [run_case(c, spec, g, swept[g], args.requests, progress, args.plan_link) for c in cases]
        results += done
        print(f"\n{g} GPUs:\n" + table(done, swept[g], args.plan_link))
        agreed = sum(c["rows"][args.plan_link]["plan_best"] == c["rows"][args.plan_link]["sim_best"] for c in done)
        print(f"\nplan pd's best ratio agrees with the simulator's on {agreed} of {len(done)} traces "
              f"({args.plan_link}, {g} GPUs)")
    print("\n" + agreement_table(results, args.plan_link))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"model": args.model, "gpu": args.gpu, "cases": results}, indent=1) + "\n")
    if args.plot:
        plot(results, links, Path(args.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
