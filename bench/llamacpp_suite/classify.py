"""Results of llama.cpp's server tests: junit XML per file into counts, and each failure into a class
by its first error line. Pure: no I/O beyond parsing the text it is given."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

OUTCOMES = ("passed", "failed", "errors", "skipped")


@dataclass
class Case:
    nodeid: str
    outcome: str  # one of OUTCOMES
    first_line: str = ""
    reason: str = ""
    hollow: list[str] = field(default_factory=list)


# (class, pattern over the first error line and the server's output); first match wins
_RULES: tuple[tuple[str, str], ...] = (
    ("server exits at start", r"Server process died"),
    ("timeout", r"Failed: Timeout|Timeout >|TimeoutError|ReadTimeout"),
    ("needs a download (model, adapter or image from the hub)", r"huggingface\.co|hf\.co|HTTPSConnectionPool|"
     r"FileNotFoundError"),
    ("missing endpoint (404)", r"\b404\b"),
    ("accepted what llama-server rejects (200 for 4xx)", r"\(?200 == [45]\d\d|assert 200 != 200|DID NOT RAISE"),
    ("rejected what llama-server accepts (4xx/5xx for 200)", r"assert [45]\d\d == 200"),
    ("no `__verbose` debug field (--verbose; it carries the rendered prompt)", r"__verbose"),
    ("constrained output ignored (grammar, json_schema, response_format)", r'Expected "|grammar|json_schema'),
    ("chat template not rendered as llama-server does (ChatML always)", r"im_start|START_OF_T|chat template|"
     r"Expected prompt to end with"),
    ("needs real weights (text of a real model)", r"match_regex|re\.search|assert_match|Ben|Jack"),
    ("a count differs (token counts of a real tokenizer, or a setting)", r"^(AssertionError: )?assert \d+ == \d+$"),
    ("generated text differs between identical requests (not deterministic per seed, stream or not)",
     r"^AssertionError: assert '[a-z]+ [a-z .]*' == '[a-z]+ [a-z .]*'$"),
    ("shape difference (field missing or different)", r"KeyError|not in|assert '|assert \"|is None|is not None|"
     r"TypeError|IndexError|AttributeError|ValidationError"),
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


ROUTER_MODE = "router mode not modelled (no model on the command line: the look-alike requires -m)"


def classify(first_line: str, output: str = "") -> str:
    if re.search(_RULES[0][1], first_line):
        why = server_error_line(output)
        if "required: -m/--model" in why:
            return ROUTER_MODE
        return f"server exits at start: {why}" if why else "server exits at start"
    for name, pattern in _RULES[1:]:
        if re.search(pattern, first_line):
            return name
    return "other"


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
            cases.append(Case(nodeid, outcome, line, classify(line, output)))
        elif skip is not None:
            cases.append(Case(nodeid, "skipped", first_error_line(skip.get("message") or "")))
        else:
            cases.append(Case(nodeid, "passed", hollow=list(misses.get(nodeid, []))))
    return cases
