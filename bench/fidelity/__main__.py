"""`python -m bench.fidelity [--json]`: every item counted, one line per item that is not matched
(all with --all), then matched / accepted / differs / missing per kind and in total."""

from __future__ import annotations

import argparse
import json
import sys

from bench.fidelity.harness import run
from bench.fidelity.items import KINDS, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fidelity", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the items and counts as JSON")
    parser.add_argument("--all", action="store_true", help="print matched items too")
    args = parser.parse_args(argv)
    items = run()
    counts = summary(items)
    if args.json:
        print(json.dumps({"counts": counts, "items": [vars(i) for i in items]}, indent=1))
        return 0
    for item in items:
        if args.all or item.verdict != "matched":
            detail = f"  {item.detail}" if item.detail else ""
            print(f"{item.verdict:8s} {item.kind:7s} {item.engine:9s} {item.name}{detail}")
    for kind in (*KINDS, "total"):
        c = counts[kind]
        print(f"{kind:7s} {sum(c.values()):4d} items: {c['matched']} matched, {c['accepted']} accepted differences, "
              f"{c['differs']} differ, {c['missing']} missing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
