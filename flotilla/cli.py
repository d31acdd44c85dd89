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


def nested_parser(argv: Sequence[str]) -> argparse.ArgumentParser | None:
    """The parser of `flotilla COMMAND SUB ...` where COMMAND's module lists SUB in SUBCOMMANDS
    (`flotilla sim sweep`): COMMAND keeps its own flags, so SUB cannot be an argparse subparser."""
    if len(argv) < 2 or argv[0] not in COMMANDS:
        return None
    subcommands = getattr(importlib.import_module(COMMANDS[argv[0]]), "SUBCOMMANDS", {})
    if argv[1] not in subcommands:
        return None
    mod = importlib.import_module(subcommands[argv[1]])
    parser = OneLineParser(prog=f"flotilla {argv[0]} {argv[1]}", description=getattr(mod, "DESCRIPTION", mod.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    mod.add_arguments(parser)
    parser.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    nested = nested_parser(argv)
    args = nested.parse_args(argv[2:]) if nested is not None else build_parser().parse_args(argv)
    args.argv = argv  # the command as given, for results that record how they were made
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `flotilla plan ... | head` must not print a traceback
        return 0


if __name__ == "__main__":
    sys.exit(main())
