from pathlib import Path

from bench.overhead.report import END, START, TargetResult, section, write_section

RESULTS = [TargetResult("direct", 1.0, 3.0, 1.5, 4.0, 2000.0, 0),
           TargetResult("flotilla proxy", 1.6, 4.5, 2.0, 5.0, 900.0, 0, 0.31, 0.22)]


def test_table_shows_added_latency_against_direct() -> None:
    text = section(RESULTS, 200, 5, 64, 3, "test box", "python -m bench.overhead")
    assert "| direct | 1.00 / 3.00 | – | 1.50 / 4.00 | – | 2,000 | – | 0 |" in text
    assert "| flotilla proxy | 1.60 / 4.50 | +0.60 / +1.50 | 2.00 / 5.00 | +0.50 | 900 | 0.310 ; 0.220 | 0 |" in text


def test_writing_replaces_only_the_overhead_section(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\nPeers first.\n\n{START}\nold\n{END}\n\n## Later section\n")
    write_section(doc, f"{START}\nnew\n{END}")
    assert doc.read_text() == f"# Benchmarks\n\nPeers first.\n\n{START}\nnew\n{END}\n\n## Later section\n"
    fresh = tmp_path / "none.md"
    write_section(fresh, f"{START}\nx\n{END}")
    assert fresh.read_text() == f"# Benchmarks\n\n{START}\nx\n{END}\n"
