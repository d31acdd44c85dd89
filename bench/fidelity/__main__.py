"""`python -m bench.fidelity [--json]`: every capture replayed, one line per item, then the counts."""

from __future__ import annotations

import argparse
import json
import sys

from bench.fidelity.replay import run, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fidelity", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the items and counts as JSON")
    args = parser.parse_args(argv)
    items = run()
    counts = summary(items)
    if args.json:
        print(json.dumps({"counts": counts, "items": [vars(i) for i in items]}, indent=1))
    else:
        for item in items:
            print(f"{item.verdict:8s} {item.engine:9s} {item.name}{'  ' + item.detail if item.detail else ''}")
        print(f"{len(items)} captures: {counts['matched']} matched, {counts['accepted']} accepted differences, "
              f"{counts['differs']} differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
