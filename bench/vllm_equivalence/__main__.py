"""python -m bench.vllm_equivalence {golden,compare,random}: see docs/fidelity.md ("scheduler").

golden   (vLLM venv) drive vLLM's scheduler over every named workload, synchronous and async,
         and write tests/data/vllm_golden/<workload>.json
compare  (either venv) replay every golden file through the fake core, step by step and with
         decode runs; print the identical steps per workload
random   (vLLM venv) N seeded random workloads through both; print how many match at every step
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.vllm_equivalence import driver, workloads

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "vllm_golden"


def _vllm_trace(workload: dict[str, Any]) -> dict[str, Any]:
    from bench.vllm_equivalence.vllm_side import VllmCore
    return driver.run(VllmCore(workload["settings"]), workload)


def _fake_trace(workload: dict[str, Any], decode_runs: bool = False) -> dict[str, Any]:
    from bench.vllm_equivalence.fake_side import FakeCore
    return driver.run(FakeCore(workload["settings"], decode_runs=decode_runs), workload)


def _golden(args: argparse.Namespace) -> int:
    import vllm
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for workload in workloads.with_async(workloads.named()):
        if args.only and workload["name"] not in args.only:
            continue
        trace = _vllm_trace(workload)
        cls = "AsyncScheduler" if workload["settings"]["async_scheduling"] else "Scheduler"
        doc = {"vllm_version": vllm.__version__, "scheduler": f"vllm.v1.core.sched.{cls}",
               "settings": workload["settings"], "workload": workload, "trace": trace}
        path = out / f"{workload['name']}.json"
        path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        print(f"{path.name}: {len(trace['steps'])} steps", flush=True)
    return 0


def load_goldens(directory: Path = GOLDEN_DIR) -> list[dict[str, Any]]:
    """Every golden file, sorted by name."""
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def _compare(args: argparse.Namespace) -> int:
    total_same = total = 0
    for doc in load_goldens(Path(args.dir)):
        w = doc["workload"]
        for decode_runs in (False, True):
            same, n, notes = driver.compare(doc["trace"], _fake_trace(w, decode_runs))
            if decode_runs and not notes:
                continue
            label = w["name"] + (" (decode runs)" if decode_runs else "")
            exact = "exact" if not notes else "DIFFERS"
            print(f"{label:45s} {100 * same / max(n, 1):6.1f} % of {n} steps identical  {exact}")
            if args.verbose:
                for note in notes:
                    print("    " + note)
            if not decode_runs:
                total_same, total = total_same + same, total + n
    print(f"all workloads: {100 * total_same / max(total, 1):.1f} % of {total} steps identical")
    return 0


def _random(args: argparse.Namespace) -> int:
    matched = 0
    for seed in range(args.start, args.start + args.count):
        w = workloads.random_workload(seed)
        same, n, notes = driver.compare(_vllm_trace(w), _fake_trace(w))
        matched += not notes
        if notes and args.verbose:
            print(f"{w['name']}: {same}/{n} identical; {notes[0][:300]}")
    print(f"{matched} of {args.count} random workloads match vLLM at every step")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vllm_equivalence", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("golden", help="write golden traces from vLLM (vLLM venv)")
    g.add_argument("--out", default=str(GOLDEN_DIR))
    g.add_argument("--only", nargs="*", help="workload names")
    c = sub.add_parser("compare", help="replay golden traces through the fake")
    c.add_argument("--dir", default=str(GOLDEN_DIR))
    c.add_argument("-v", "--verbose", action="store_true")
    r = sub.add_parser("random", help="seeded random workloads through both (vLLM venv)")
    r.add_argument("--count", type=int, default=100)
    r.add_argument("--start", type=int, default=1000)
    r.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    return {"golden": _golden, "compare": _compare, "random": _random}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
