"""YAML as people write deployment files: keys in the order given, command lines and short lists
on one line, multi-line text (an embedded config file) as a literal block."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import yaml

WIDTH = 110
"""Flow lists wrap past this many characters, as the repository's line length."""


class _Dumper(yaml.SafeDumper):
    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        # lists indented under their key, as kubectl and most hand-written files do
        super().increase_indent(flow, False)

    def ignore_aliases(self, data: object) -> bool:
        return True  # a shared mapping is written out each time, never as &anchor / *alias


def _text(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


def _list(dumper: yaml.SafeDumper, data: Sequence[Any]) -> yaml.SequenceNode:
    flat = all(isinstance(x, str | int | float | bool) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat and bool(data))


_Dumper.add_representer(str, _text)
_Dumper.add_representer(list, _list)
_Dumper.add_representer(tuple, _list)


def dump(document: object) -> str:
    """One YAML document."""
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=WIDTH, allow_unicode=True)


def comment(text: str) -> str:
    """`text` as YAML comment lines."""
    return "".join(f"# {line}".rstrip() + "\n" for line in text.strip("\n").splitlines())


def documents(parts: Iterable[tuple[str, object]]) -> str:
    """Several (comment, document) pairs as one multi-document stream."""
    return "---\n".join(comment(note) + dump(doc) if note else dump(doc) for note, doc in parts)
