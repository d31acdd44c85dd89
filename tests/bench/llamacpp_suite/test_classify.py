from collections import Counter
from pathlib import Path

from bench.llamacpp_suite.classify import ROUTER_MODE, classify, first_error_line, machine_free, parse_junit
from bench.llamacpp_suite.report import HEADING, render, replace_section

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="unit.test_basic" name="test_ok" />
<testcase classname="unit.test_basic" name="test_error_route" />
<testcase classname="unit.test_basic" name="test_no_ui"><failure message="assert 404 == 200">x</failure></testcase>
<testcase classname="unit.test_basic" name="test_addr"><failure message="RuntimeError: Server process died with return code 2">x</failure>
<system-out>tests: starting server with: llama-server --host a,b
error: cannot listen on a,b: no such host name (--host)</system-out></testcase>
<testcase classname="unit.test_basic" name="test_skip"><skipped message="needs GPU" /></testcase>
</testsuite></testsuites>"""


def test_outcomes_classes_and_hollow_passes_come_from_the_report():
    cases = parse_junit(JUNIT, {"unit/test_basic.py::test_error_route": ["POST /infill"]})
    assert Counter(c.outcome for c in cases) == {"passed": 2, "failed": 2, "skipped": 1}
    by_name = {c.nodeid.split("::")[1]: c for c in cases}
    assert by_name["test_no_ui"].reason == "missing endpoint (404)"
    assert by_name["test_addr"].reason == "server exits at start: error: cannot listen on a,b: no such host name (--host)"
    assert by_name["test_error_route"].hollow == ["POST /infill"]
    assert by_name["test_ok"].hollow == []


def test_first_lines_map_to_named_classes():
    assert classify("assert 200 == 400") == "accepted what llama-server rejects (200 for 4xx)"
    assert classify("KeyError: 'embedding'") == "shape difference (field missing or different)"
    assert classify("Failed: Timeout >90.0s") == "timeout"
    assert classify("something new") == "other"
    assert classify("AssertionError: assert 'all red ' == 'box she far ... fox '").startswith("generated text differs")
    assert classify("AssertionError: assert 'stop' == 'length'").startswith("shape difference")
    died = "RuntimeError: Server process died with return code 2"
    usage = "fake-llama-server: error: the following arguments are required: -m/--model (see fake-llama-server --help)"
    assert classify(died, usage) == ROUTER_MODE


def test_the_section_is_replaced_in_place_and_appended_when_absent():
    section = render({"unit/test_basic.py": parse_junit(JUNIT)}, "python -m bench.llamacpp_suite")
    assert "**2 passed, 2 failed, 0 errors, 1 skipped of 5**" in section
    assert "| unit/test_basic.py | 2 | 2 | 0 | 1 |" in section
    doc = "# T\n\n## A\na\n\n" + HEADING + "\nold\n\n## B\nb\n"
    new = replace_section(doc, section)
    assert "old" not in new and new.endswith("## B\nb\n") and new.count(HEADING) == 1
    assert replace_section("# T\n", section).endswith(section)


def test_a_published_error_line_names_no_path_of_the_machine_it_ran_on():
    message = ("FileNotFoundError: [Errno 2] No such file or directory: "
               "'/home/ci/.cache/flotilla/llamacpp-suite/server/tests/./tmp/stories15M-q4_0.gguf5sfq.tmp'")
    line = first_error_line(message)
    assert line.endswith("'tests/tmp/stories15M-q4_0.gguf5sfq.tmp'") and "/home/ci" not in line
    assert machine_free(f"cannot open {Path.home()}/models/x.gguf") == "cannot open ~/models/x.gguf"
