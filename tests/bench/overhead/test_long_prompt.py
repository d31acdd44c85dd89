import json
from pathlib import Path

from bench.overhead.__main__ import main
from bench.overhead.long_prompt import END, START, bodies, long_text


def test_the_prompt_is_ascii_of_the_asked_length_in_both_bodies() -> None:
    text = long_text(4_000)
    assert len(text) == 4_000 and text.isascii() and text == long_text(4_000)
    sent = {kind: json.loads(body) for kind, (_, body) in bodies(4_000).items()}
    assert sent["completions"]["prompt"] == text
    assert sent["chat"]["messages"][-1]["content"] == text


def test_long_prompt_mode_measures_each_request_kind_through_a_real_proxy(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\n{START}\nold\n{END}\n\n## Later\n")
    assert main(["--long-prompt", "--chars", "4000", "--pairs", "4", "--warmup", "1",
                 "--policies", "round-robin", "--quiet-wait-s", "0", "--write", str(doc)]) == 0
    text = doc.read_text()
    assert "old" not in text and text.endswith(f"{END}\n\n## Later\n")
    rows = [line for line in text.splitlines() if line.startswith("| `round-robin` |")]
    assert [row.split(" | ")[1] for row in rows] == ["completions", "chat"]
