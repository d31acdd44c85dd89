"""The `flotilla` command: a thin dispatch into the packages.

Each subcommand lives in its own module exposing ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. Those modules import their heavy dependencies inside ``run``, so
``flotilla plan`` never pays for aiohttp and ``flotilla proxy`` never pays for matplotlib.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from flotilla.cli_errors import OneLineParser

# subcommand -> module implementing it
COMMANDS: dict[str, str] = {
    "plan": "flotilla.plan",
    "proxy": "flotilla.proxy_cmd",
    "loadgen": "flotilla.loadgen_cmd",
    "sim": "flotilla.sim_cmd",
    "up": "flotilla.up_cmd",
    "compose": "flotilla.compose_cmd",
    "k8s": "flotilla.k8s_cmd",
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(  # usage mistakes are one line on stderr, exit status 2
        prog="flotilla",
        description="Router, autoscaler, capacity planner, load generator and simulator for LLM engine fleets.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `flotilla plan ... | head` must not print a traceback
        return 0


if __name__ == "__main__":
    sys.exit(main())
