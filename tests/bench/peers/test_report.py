"""Round statistics, table cells and the docs block writer."""

from __future__ import annotations

from pathlib import Path

from bench.peers.report import added, cell, markdown_table, spread, write_block


def test_spread_skips_missing_and_nan() -> None:
    assert spread([3.0, None, 1.0, float("nan"), 2.0]) == (2.0, 1.0, 3.0)
    assert spread([None]) is None


def test_cell_shows_median_and_range_over_rounds() -> None:
    assert cell([1.234, 1.5, 2.0]) == "1.50 [1.23–2.00]"
    assert cell([0.1, 0.1]) == "0.10"  # rounds agree: one figure
    assert cell([0.25, 0.5], 1, scale=100.0) == "37.5 [25.0–50.0]"
    assert cell([None, None]) == "–"
    assert cell([12345.0, 23456.0], 0) == "17,900 [12,345–23,456]"


def test_added_is_difference_of_medians_signed() -> None:
    assert added([2.0, 3.0, 4.0], [1.0, 1.5]) == "+1.75"
    assert added([1.0], [1.2]) == "-0.20"
    assert added([], [1.0]) == "–"


def test_markdown_table_shape() -> None:
    assert markdown_table(["a", "b"], [["1", "2"]]) == "| a | b |\n|---|---|\n| 1 | 2 |"


def test_block_is_appended_then_replaced_leaving_other_sections(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n<!-- overhead:start -->\nproxy section\n<!-- overhead:end -->\n")
    write_block(doc, "peers-overhead", "## Peers\nfirst")
    write_block(doc, "peers-quality", "quality")
    write_block(doc, "peers-overhead", "## Peers\nsecond")
    text = doc.read_text()
    assert "proxy section" in text and "first" not in text
    assert text.count("<!-- peers-overhead:start -->") == 1
    assert text.index("second") < text.index("quality")


def test_block_text_with_backslashes_is_written_verbatim(tmp_path: Path) -> None:
    doc = tmp_path / "b.md"
    write_block(doc, "x", "a")
    write_block(doc, "x", r"C:\new \1 path")
    assert r"C:\new \1 path" in doc.read_text()
