"""edit_file's text work (server-tools.cpp `server_tool_edit_file`): exact text replacements, or, when an old_text is not found as is, replacements on text with trailing blanks
dropped and typographic quotes, dashes and spaces made ASCII, keeping the untouched lines as they
were. Each old_text must be unique (counted on the normalised text) and edits must not overlap.

Pure: the tool reads and writes the file (tools_builtin.py); bytes that are not UTF-8 survive.
"""

from __future__ import annotations

_ASCII = str.maketrans({**{c: "'" for c in "\u2018\u2019\u201a\u201b"}, **{c: '"' for c in "\u201c\u201d\u201e\u201f"},
                        **{chr(c): "-" for c in range(0x2010, 0x2016)}, "\u2212": "-", "\u00a0": " ",
                        **{chr(c): " " for c in range(0x2002, 0x200b)}, "\u202f": " ", "\u205f": " ",
                        "\u3000": " "})


def normalize(content: str) -> str:
    """Line by line: trailing spaces, tabs and CRs dropped, smart punctuation made ASCII."""
    return "\n".join(line.rstrip(" \t\r").translate(_ASCII) for line in content.split("\n"))


def _lines_with_endings(content: str) -> list[str]:
    lines = [line + "\n" for line in content.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def apply_edits(content: bytes, path: str, edits: list[tuple[str, str]]) -> bytes | dict:
    """The file's new content after the (old_text, new_text) edits, or {"error"}; `path` is how
    errors name the file."""
    original = content.decode("utf-8", errors="surrogateescape")
    fuzzy = False
    for i, (old, _) in enumerate(edits):
        if old in original:
            continue
        if normalize(old) not in normalize(original):
            return {"error": f"could not find edits[{i}].old_text in {path}, it must match the file's current "
                             "content exactly"}
        fuzzy = True
    base = normalize(original) if fuzzy else original
    matched = []  # (index in base, length, edit number, new_text)
    for i, (old, new) in enumerate(edits):
        occurrences = normalize(original).count(normalize(old))
        if occurrences > 1:
            return {"error": f"found {occurrences} occurrences of edits[{i}].old_text in {path}, it must be unique"}
        needle = normalize(old) if fuzzy else old
        matched.append((base.find(needle), len(needle), i, new))
    matched.sort()
    for a, b in zip(matched, matched[1:], strict=False):
        if a[0] + a[1] > b[0]:
            return {"error": f"edits[{a[2]}] and edits[{b[2]}] overlap in {path}; merge them into one edit or "
                             "target disjoint regions"}
    result = _keep_untouched_lines(original, base, matched) if fuzzy else _replace(base, matched, 0)
    if result == original:
        return {"error": "no changes made: the replacement(s) produced identical content"}
    return result.encode("utf-8", errors="surrogateescape")


def _replace(content: str, matched: list[tuple[int, int, int, str]], offset: int) -> str:
    for index, length, _, new in reversed(matched):
        local = index - offset
        content = content[:local] + new + content[local + length:]
    return content


def _keep_untouched_lines(original: str, base: str, matched: list[tuple[int, int, int, str]]) -> str:
    """Replacements made on the normalised text, spliced into the original's untouched lines."""
    spans, offset = [], 0
    for line in _lines_with_endings(base):
        spans.append((offset, offset + len(line)))
        offset += len(line)
    groups: list[list] = []  # [first line, end line (exclusive), replacements]
    for rep in matched:
        start = next((n for n, (s, e) in enumerate(spans) if s <= rep[0] < e), 0)
        end = start
        while end < len(spans) - 1 and spans[end][1] < rep[0] + rep[1]:
            end += 1
        if groups and start < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], end + 1)
            groups[-1][2].append(rep)
        else:
            groups.append([start, end + 1, [rep]])
    originals, out, at = _lines_with_endings(original), [], 0
    for start, end, reps in groups:
        out.extend(originals[at:start])
        lo, hi = spans[start][0], spans[end - 1][1]
        out.append(_replace(base[lo:hi], reps, lo))
        at = end
    out.extend(originals[at:])
    return "".join(out)
