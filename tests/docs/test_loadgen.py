"""docs/loadgen.md and docs/quickstart.md quote the time-base lines `flotilla loadgen` prints."""

from __future__ import annotations

from loadgen.timebase import time_base
from tests.conftest import REPO

LOADGEN = (REPO / "docs" / "loadgen.md").read_text()
QUICKSTART = (REPO / "docs" / "quickstart.md").read_text()


def test_the_quoted_modelled_time_line_is_the_one_printed():
    line = time_base({"0.05": 149}).note
    assert f"\n{line}\n" in LOADGEN and f"\n{line}\n" in QUICKSTART


def test_the_quoted_wall_time_lines_are_the_ones_printed():
    assert f"`{time_base({}).note}`" in LOADGEN
    mixed = time_base({"0.05": 30, "0.1": 7}).note
    assert f"`... {mixed.split('responses ', 1)[1]}`" in LOADGEN
