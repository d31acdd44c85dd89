"""Results of llama.cpp's server tests: junit XML per file into counts, and each failure into a reason:
first the table of tests out of reach by nature (out_of_reach.py), then the named difference its first error
line, its failing line and its route misses show. Pure: no I/O beyond parsing the text it is given."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from bench.llamacpp_suite.out_of_reach import out_of_reach

OUTCOMES = ("passed", "failed", "errors", "skipped")


@dataclass
class Case:
    nodeid: str
    outcome: str  # one of OUTCOMES
    first_line: str = ""
    reason: str = ""
    hollow: list[str] = field(default_factory=list)
    kind: str = ""  # for a failure out of reach by nature, its kind (out_of_reach.KINDS); "" for a named difference
    statement: str = ""  # the test's own line that failed


def _status(first_line: str, statement: str) -> str | None:
    """A status-code assertion named by what the look-alike answered and what llama-server answers."""
    if "status_code" not in statement:
        return None
    if found := re.search(r"assert (\d{3}) == (\d{3})", first_line):
        got, want = found.groups()
        return f"status {got} where llama-server answers {want}"
    if re.search(r"assert (\d{3}) != \1", first_line):
        return "accepted what llama-server rejects (200 where it answers an error)"
    return None


# (class, pattern over the test's failing line); first match wins. Each names what the assertion checks.
_STATEMENT_RULES: tuple[tuple[str, str], ...] = (
    ("generates another number of tokens than the n_predict the test asks (predicted_n, completion_probabilities)",
     r'predicted_n"\] == n_(predict|token_output)|len\(completions\) == n_predict'),
    ("logit_bias not applied (a banned word is in the text)", r"for tok in exclude"),
    ("no prompt_progress chunks (return_progress)", r"progress"),
    ("timings.predicted_per_second is not 1e3 / predicted_ms * (predicted_n - 1)", r"predicted_per_second"),
    ("unexpected finish_reason on a stream chunk (the look-alike stopped where the test reads on)",
     r'finish_reason"\] is None'),
    ("error message wording differs", r'in res\.body\["error"\]\["message"\]|in str\(res\.body\)'),
    ("no `__verbose` debug field (--verbose; it carries the rendered prompt)", r"__verbose"),
)

# (class, pattern over the first error line); first match wins
_RULES: tuple[tuple[str, str], ...] = (
    ("server exits at start", r"Server process died"),
    ("timeout", r"Failed: Timeout|Timeout >|TimeoutError|ReadTimeout"),
    ("needs a download (hub or internet) not in the out-of-reach table",
     r"huggingface\.co|hf\.co|HTTPSConnectionPool|URLError|Name or service not known"),
    ("missing endpoint (404)", r"\b404\b|File Not Found"),
    ("accepted what llama-server rejects (no error raised)", r"DID NOT RAISE"),
    ("constrained output ignored (grammar, json_schema, response_format)", r'Expected "|grammar|json_schema'),
    ("generated text differs between identical requests (not deterministic per seed, stream or not)",
     r"^AssertionError: assert '[a-z]+ [a-z .]*' == '[a-z]+ [a-z .]*'$"),
    ("a field the test reads is missing (KeyError)", r"KeyError"),
    ("connection refused or dropped", r"ConnectionError|ConnectionRefused|RemoteDisconnected|APIConnectionError"),
)


_MACHINE_PATH = re.compile(r"/[^\s'\"]*?/server/tests/(?:\./)?")
"""An absolute path into this machine's copy of upstream's tests: published relative to them."""


def machine_free(line: str) -> str:
    """`line` with paths into this machine's copy of the tests written relative to it (`tests/...`)
    and the home folder as `~`, so the published list names no path of the machine it ran on."""
    return _MACHINE_PATH.sub("tests/", line).replace(str(Path.home()), "~")


def first_error_line(message: str) -> str:
    for line in message.splitlines():
        if line.strip():
            return machine_free(line.strip())[:200]
    return ""


def server_error_line(output: str) -> str:
    """The look-alike's own complaint when it exits at start (argparse or config error): the last line
    with "error" that is not the tests' own."""
    lines = [line.strip() for line in output.splitlines()
             if "error" in line.lower() and not line.startswith(("tests:", "E ", ">"))]
    return machine_free(lines[-1])[:200] if lines else ""


EXPECTED_MISSES: dict[str, tuple[str, ...]] = {
    # with --no-webui llama-server registers no `/`: its 404 "File Not Found" is what the test asserts
    "unit/test_basic.py::test_no_ui": ("GET /",),
}
"""Route misses a test asserts (judged from its source): they do not make its pass hollow."""


def hollow_routes(nodeid: str, misses: list[str]) -> list[str]:
    """The route misses that make a pass hollow: those the test does not itself expect."""
    expected = EXPECTED_MISSES.get(nodeid, ())
    return [route for route in misses if route not in expected]


ROUTER_MODE = "router mode not modelled (no model on the command line: the look-alike requires -m)"


def classify(first_line: str, output: str = "", statement: str = "", routes: list[str] | None = None) -> str:
    """The named difference a failure shows: its first error line, the test's failing line (`statement`),
    the server's output and the routes it missed; the residue is named by its failing line."""
    if re.search(_RULES[0][1], first_line):
        why = server_error_line(output)
        if "required: -m/--model" in why:
            return ROUTER_MODE
        return f"server exits at start: {why}" if why else "server exits at start"
    if routes:
        return "missing endpoint: " + ", ".join(sorted(set(routes)))
    if status := _status(first_line, statement):
        return status
    for name, pattern in _STATEMENT_RULES:
        if statement and re.search(pattern, statement):
            return name
    for name, pattern in _RULES[1:]:
        if re.search(pattern, first_line):
            return name
    if statement:
        return f"assertion not met: {statement[:120]}"
    return f"other: {first_line[:120]}" if first_line else "other"


_FRAME_END = re.compile(r"^unit/test_\w+\.py:\d+: ")


def failing_statement(text: str) -> str:
    """The test's own line that failed: in pytest's long report, the `>` line of the deepest frame in a
    unit/test_*.py file (a frame ends with `file:line: Error`)."""
    last, found = "", ""
    for line in text.splitlines():
        if line.startswith(">"):
            last = line[1:].strip()
        elif _FRAME_END.match(line) and last:
            found = last
    return machine_free(found)[:200]


def parse_junit(xml_text: str, misses: dict[str, list[str]] | None = None) -> list[Case]:
    """Cases of one junit XML report; `misses` (nodeid -> route misses seen) marks hollow passes."""
    misses = misses or {}
    cases = []
    for tc in ET.fromstring(xml_text).iter("testcase"):
        nodeid = f"{tc.get('classname', '').replace('.', '/')}.py::{tc.get('name')}"
        bad, err, skip = tc.find("failure"), tc.find("error"), tc.find("skipped")
        output = "".join((x.text or "") for x in (tc.find("system-out"), tc.find("system-err")) if x is not None)
        node = bad if bad is not None else err
        if node is not None:
            line = first_error_line(node.get("message") or node.text or "")
            outcome = "failed" if bad is not None else "errors"
            statement = failing_statement(node.text or "")
            nature = out_of_reach(nodeid)
            kind, reason = nature if nature else ("", classify(line, output, statement,
                                                                 hollow_routes(nodeid, misses.get(nodeid, []))))
            cases.append(Case(nodeid, outcome, line, reason, kind=kind, statement=statement))
        elif skip is not None:
            cases.append(Case(nodeid, "skipped", first_error_line(skip.get("message") or "")))
        else:
            cases.append(Case(nodeid, "passed", hollow=hollow_routes(nodeid, misses.get(nodeid, []))))
    return cases
