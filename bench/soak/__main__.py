"""`python -m bench.soak --minutes N --concurrency C`: soak the proxy with faults switched on."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from bench.soak.report import Bounds, over_bounds
from bench.soak.run import REPO, SoakConfig, run_soak


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--engines", type=int, default=3)
    p.add_argument("--time-scale", type=float, default=0.01)
    p.add_argument("--sample-every-s", type=float, default=1.0)
    p.add_argument("--fault-every-s", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "soak.json")
    args = p.parse_args(argv)
    config = SoakConfig(minutes=args.minutes, concurrency=args.concurrency, engines=args.engines,
                        time_scale=args.time_scale, sample_every_s=args.sample_every_s,
                        fault_every_s=args.fault_every_s, seed=args.seed)
    report = asyncio.run(run_soak(config))
    bounds = Bounds()
    print(report.text(bounds))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report.to_json())
    leaked = len(report.samples) >= 4 and over_bounds(report.samples, bounds)
    return 1 if report.unanswered or leaked else 0


if __name__ == "__main__":
    sys.exit(main())
