"""The real engines' other flags on the look-alikes' parsers: accepted, without effect.

A command line copied from a real deployment passes flags the look-alike has no use for
(--trust-remote-code, --download-dir, -t 8, --jinja, ...). Each engine's table of its real flags
(fake_engines/vllm/upstream_flags.py, fake_engines/llamacpp/upstream_flags.py, generated from the
real engines' help by scripts/upstream/flag_tables.py) is laid over the parser after the flags
the look-alike models: a spelling it already has keeps its meaning, every other one is accepted
with the real engine's arity and choices and its help, marked as without effect.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

UpstreamRow = tuple[tuple[str, ...], str, tuple[str, ...], str]
"""(spellings, arity: flag / value / optional / values, choices, help) of one real flag."""

NO_EFFECT = "accepted for compatibility; no effect on the look-alike"
_NARGS = {"value": None, "optional": "?", "values": "+"}


def _negative(spelling: str) -> bool:
    return spelling.lstrip("-").startswith("no-")


def add_upstream_flags(parser: argparse.ArgumentParser, rows: Iterable[UpstreamRow], title: str,
                       skip: Iterable[str] = ()) -> list[UpstreamRow]:
    """Add every real flag `parser` lacks to a group named `title`; give the real help to the
    parser's own flags that have none. Returns the rows added (what docs list as without effect)."""
    known = parser._option_string_actions  # argparse has no public view of its spellings
    group = parser.add_argument_group(title)
    added = []
    skipped = set(skip)
    for spellings, arity, choices, raw_help in rows:
        help_ = raw_help.replace("%", "%%")  # argparse formats help with %
        if skipped & set(spellings):
            continue
        own = [known[s] for s in spellings if s in known]
        free = [s for s in spellings if s not in known]
        if own:
            _alias(group, own[0], free)
            if not own[0].help and help_:
                own[0].help = help_
            continue
        text = f"{help_} ({NO_EFFECT})" if help_ else NO_EFFECT.capitalize()
        if arity == "flag":
            group.add_argument(*spellings, action="store_true", dest=_dest(spellings), help=text)
        else:
            group.add_argument(*spellings, nargs=_NARGS[arity], choices=choices or None, dest=_dest(spellings),
                               metavar=None if choices else "VALUE", help=text)
        added.append((spellings, arity, choices, raw_help))
    return added


def _dest(spellings: tuple[str, ...]) -> str:
    longest = max(spellings, key=len)
    return "upstream_" + longest.lstrip("-").replace("-", "_")


def _alias(group: argparse._ArgumentGroup, action: argparse.Action, spellings: list[str]) -> None:
    """The real engine's other spellings of a flag the look-alike has (--no-enable-lora, -s)."""
    if not spellings:
        return
    if action.nargs == 0:
        for spelling in spellings:
            # the look-alike's flags are store_true: a spelling of the other sign (--no-enable-lora
            # of --enable-lora, --warmup of --no-warmup) stores False
            same_sign = _negative(spelling) == _negative(action.option_strings[0])
            group.add_argument(spelling, action="store_const", const=same_sign, dest=action.dest,
                               default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        return
    group.add_argument(*spellings, dest=action.dest, type=action.type or str, nargs=action.nargs,
                       choices=action.choices, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
