"""edit_file's matching (tools_edit.py): exact first, else through trailing blanks and typographic
punctuation, keeping the lines it does not touch byte for byte."""

from __future__ import annotations

from fake_engines.llamacpp.tools_edit import edit_file, normalize


def test_edit_file_matches_through_trailing_blanks_and_smart_quotes_keeping_other_lines(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("keep   \nsay \u201chi\u201d  \nend\n")
    assert normalize("a \t\n\u2018b\u2019\u00a0") == "a\n'b' "
    result = edit_file(str(path), "f.txt", [("say \"hi\"", "say \"bye\"")])
    assert result == {"result": "file edited successfully", "path": "f.txt", "edits_applied": 1}
    assert path.read_text() == "keep   \nsay \"bye\"\nend\n"  # untouched lines keep their blanks
    assert edit_file(str(path), "f.txt", [("absent", "x")])["error"].startswith("could not find edits[0].old_text")
    assert edit_file(str(path), "f.txt", [("end", "end")]) == {
        "error": "no changes made: the replacement(s) produced identical content"}
