"""The README's capacity-planning section shows real output: every `$ flotilla plan ...` block is re-run."""

from __future__ import annotations

import re
import shlex

import pytest

from flotilla.cli import main
from tests.conftest import REPO

README = REPO / "README.md"


def _guide() -> str:
    """The README's "Capacity planning" section, up to the next top-level section."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Capacity planning\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def _examples() -> list[tuple[str, str]]:
    """(command, printed output) for each command shown in a code block of the guide."""
    pairs = []
    for block in re.findall(r"```\n(.*?)```", _guide(), flags=re.S):
        for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, _, output = chunk.partition("\n")
            pairs.append((command, output.rstrip("\n") + "\n"))
    return pairs


def test_the_guide_has_commands_for_its_three_questions() -> None:
    assert len(_examples()) >= 9


@pytest.mark.parametrize(("command", "output"), _examples(), ids=lambda v: v if v.startswith("flotilla") else "")
def test_each_command_prints_what_the_guide_shows(command: str, output: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    argv = shlex.split(command)
    assert argv[0] == "flotilla"
    assert main(argv[1:]) == 0
    assert capsys.readouterr().out == output
