"""The "llama.cpp's server tests" section of docs/fidelity.md from the classified results."""

from __future__ import annotations

from collections import Counter

from bench.llamacpp_suite.classify import OUTCOMES, Case

HEADING = "## llama.cpp's server tests"


def render(results: dict[str, list[Case]], command: str) -> str:
    every = [c for cs in results.values() for c in cs]
    totals = Counter(c.outcome for c in every)
    hollow = [c for c in every if c.outcome == "passed" and c.hollow]
    lines = [HEADING, "",
             f"**{totals['passed']} passed, {totals['failed']} failed, {totals['errors']} errors, "
             f"{totals['skipped']} skipped of {len(every)}** ({len(hollow)} of the passes hollow: they received "
             "a \"File Not Found\" 404 of a route the look-alike lacks).", "",
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
             "receives through `make_request`: a pass with one is listed as hollow. Failures are classed by their "
             "first error line (`bench/llamacpp_suite/classify.py`).", "",
             "| file | passed | failed | errors | skipped |", "|---|---:|---:|---:|---:|"]
    for file, cases in results.items():
        n = Counter(c.outcome for c in cases)
        lines.append(f"| {file} | " + " | ".join(str(n[o]) for o in OUTCOMES) + " |")
    lines += ["", "Failures and errors by class (first error line):", "",
              "| class | tests |", "|---|---:|"]
    classes = Counter(c.reason for c in every if c.outcome in ("failed", "errors"))
    lines += [f"| {name} | {count} |" for name, count in classes.most_common()]
    if hollow:
        lines += ["", "Hollow passes (route misses seen):", ""]
        lines += [f"- `{c.nodeid}`: {', '.join(sorted(set(c.hollow)))}" for c in hollow]
    lines += ["", "<details><summary>Every failure with its first error line</summary>", ""]
    for c in every:
        if c.outcome in ("failed", "errors"):
            lines.append(f"- `{c.nodeid}` ({c.reason}): `{c.first_line.replace('`', '')}`")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def replace_section(doc: str, section: str) -> str:
    """doc with its section (heading to the next `## `) replaced, or the section appended."""
    start = doc.find(HEADING + "\n")
    if start < 0:
        return doc.rstrip("\n") + "\n\n" + section
    end = doc.find("\n## ", start + len(HEADING))
    return doc[:start] + section + (doc[end + 1:] if end >= 0 else "")
