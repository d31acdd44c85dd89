"""edit_file's matching (tools_edit.py): exact first, else through trailing blanks and typographic
punctuation, keeping the lines it does not touch byte for byte."""

from __future__ import annotations

from fake_engines.llamacpp.tools_edit import apply_edits, normalize


def test_edit_file_matches_through_trailing_blanks_and_smart_quotes_keeping_other_lines():
    original = "keep   \nsay \u201chi\u201d  \nend\n".encode()
    assert normalize("a \t\n\u2018b\u2019\u00a0") == "a\n'b' "
    edited = apply_edits(original, "f.txt", [("say \"hi\"", "say \"bye\"")])
    assert edited == b"keep   \nsay \"bye\"\nend\n"  # untouched lines keep their blanks
    assert apply_edits(original, "f.txt", [("keep", "k"), ("end\n", "fin\n")]) == \
        "k   \nsay \u201chi\u201d  \nfin\n".encode()  # exact matches leave the rest alone
    assert apply_edits(original, "f.txt", [("absent", "x")])["error"].startswith("could not find edits[0].old_text")
    assert apply_edits(original, "f.txt", [("end", "end")]) == {
        "error": "no changes made: the replacement(s) produced identical content"}
    assert apply_edits(b"\xff\nx\n", "b.bin", [("x", "y")]) == b"\xff\ny\n"  # bytes that are not UTF-8 survive
