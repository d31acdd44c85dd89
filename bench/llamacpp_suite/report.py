"""The "llama.cpp's server tests" section of docs/fidelity.md from the classified results."""

from __future__ import annotations

from collections import Counter

from bench.llamacpp_suite.classify import OUTCOMES, Case
from bench.llamacpp_suite.out_of_reach import KINDS, out_of_reach

HEADING = "## llama.cpp's server tests"


def render(results: dict[str, list[Case]], command: str) -> str:
    every = [c for cs in results.values() for c in cs]
    totals = Counter(c.outcome for c in every)
    hollow = [c for c in every if c.outcome == "passed" and c.hollow]
    lines = [HEADING, "",
             f"**{totals['passed']} passed, {totals['failed']} failed, {totals['errors']} errors, "
             f"{totals['skipped']} skipped of {len(every)}**.", "",
             _hollow_line(hollow), "",
             "llama.cpp's own `tools/server/tests` (pytest) from the llama-cpp-python 0.3.36 sdist (commit "
             "0c1e570, the captured build), upstream's default selection (`-m \"not slow\"`, as its `tests.sh`), "
             "run file by file against `fake-llama-server` through `bench/llamacpp_suite/wrapper.py`, which maps "
             "only model downloads (`--hf-repo`/`--hf-file`/`--model-url`, `-m` of a missing file) to the catalogue "
             "model `llama-3.2-1b-Q8_0.gguf`, and a `--chat-template-file` under llama.cpp's `models/templates/` "
             "to the sdist's copy of that file; every other flag passes through. Not in `make test`. Command "
             f"(sdist, tests and their venv under ~/.cache/flotilla/llamacpp-suite): `{command}` (one file: "
             "`python -m bench.llamacpp_suite unit/test_basic.py`; `--reparse` classifies the last reports again). "
             "A pytest plugin (`bench/llamacpp_suite/plugin.py`) turns the session fixture that pre-downloads every "
             "preset's model (`ServerPreset.load_all`) into a no-op and records every \"File Not Found\" 404 a test "
             "receives (through utils' helpers, `requests` or the openai client): a pass with one is hollow, unless the "
             "test asserts that 404 itself. Each failure carries a reason "
             "(`bench/llamacpp_suite/classify.py`): a test out of reach by nature is named in "
             "`bench/llamacpp_suite/out_of_reach.py`, judged from its source (it asserts on a real model's text, "
             "scores or tokenizer, or needs a file from the hub, the internet or a container engine); every other "
             "failure is a named difference still open, read from its first error line, the test's failing line "
             "and the routes it missed.", "",
             "| file | passed | failed | errors | skipped |", "|---|---:|---:|---:|---:|"]
    for file, cases in results.items():
        n = Counter(c.outcome for c in cases)
        lines.append(f"| {file} | " + " | ".join(str(n[o]) for o in OUTCOMES) + " |")
    failures = [c for c in every if c.outcome in ("failed", "errors")]
    lines += _out_of_reach_table([c for c in failures if c.kind])
    lines += _differences_table([c for c in failures if not c.kind])
    passing = [c for c in every if c.outcome == "passed" and out_of_reach(c.nodeid)]
    if passing:
        lines += ["", "Passes of tests the table calls out of reach (each is worth a look: an imitation of a real "
                  "model is no fidelity):", ""]
        lines += [f"- `{c.nodeid}`" for c in passing]
    lines += ["", "<details><summary>Every failure with its reason and first error line</summary>", ""]
    for c in failures:
        where = f"out of reach, {c.kind}: {c.reason}" if c.kind else c.reason
        lines.append(f"- `{c.nodeid}` ({where}): `{c.first_line.replace('`', '')}`")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def _hollow_line(hollow: list[Case]) -> str:
    if not hollow:
        return ("**Hollow passes: none** (no pass received a \"File Not Found\" 404 of a route the look-alike "
                "lacks).")
    listed = "; ".join(f"`{c.nodeid}`: {', '.join(sorted(set(c.hollow)))}" for c in hollow)
    return f"**Hollow passes: {len(hollow)}** (each received a \"File Not Found\" 404 of a route the look-alike " \
           f"lacks): {listed}."


def _out_of_reach_table(cases: list[Case]) -> list[str]:
    kinds = Counter(c.kind for c in cases)
    summary = ", ".join(f"{kind} {n}" for kind, n in kinds.most_common())
    lines = ["", f"**Out of reach (real weights/text, downloads, container runtime): {len(cases)}**"
             + (f" ({summary})." if cases else "."), ""]
    if not cases:
        return lines
    lines += ["| kind | what the tests need | tests |", "|---|---|---:|"]
    reasons = Counter((c.kind, c.reason) for c in cases)
    for (kind, reason), n in sorted(reasons.items(), key=lambda kv: (-kinds[kv[0][0]], kv[0][0], -kv[1], kv[0][1])):
        lines.append(f"| {kind} | {_cell(reason)} | {n} |")
    lines += ["", "Kinds: " + "; ".join(f"{kind}: {KINDS[kind]}" for kind in kinds) + "."]
    return lines


def _differences_table(cases: list[Case]) -> list[str]:
    lines = ["", f"**Named differences still open: {len(cases)}**" + ("." if not cases else ""), ""]
    if cases:
        lines += ["| difference | tests |", "|---|---:|"]
        lines += [f"| {_cell(reason)} | {n} |" for reason, n in Counter(c.reason for c in cases).most_common()]
    return lines


def _cell(text: str) -> str:
    """text for a markdown table cell: its `|` (regex alternations) escaped."""
    return text.replace("|", "\\|")


def replace_section(doc: str, section: str) -> str:
    """doc with its section (heading to the next `## `) replaced, or the section appended."""
    start = doc.find(HEADING + "\n")
    if start < 0:
        return doc.rstrip("\n") + "\n\n" + section
    end = doc.find("\n## ", start + len(HEADING))
    return doc[:start] + section + (doc[end + 1:] if end >= 0 else "")
