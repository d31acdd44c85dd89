from collections import Counter
from pathlib import Path

from bench.llamacpp_suite.classify import (
    ROUTER_MODE,
    classify,
    failing_statement,
    first_error_line,
    machine_free,
    parse_junit,
)
from bench.llamacpp_suite.out_of_reach import KINDS, OUT_OF_REACH, out_of_reach
from bench.llamacpp_suite.report import HEADING, render, replace_section

# pytest's long report of a failure: the test's own failing line is the `>` line of the frame in unit/test_*.py
UNIFIED = """    def test_completion_n_predict(n_ctx, n_slots, n_predict_vals, expected_success):
&gt;                   assert res.body["timings"]["predicted_n"] == n_predict
E                   assert 62 == 80

unit/test_completion.py:408: AssertionError"""

JUNIT = f"""<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="unit.test_basic" name="test_ok" />
<testcase classname="unit.test_basic" name="test_error_route" />
<testcase classname="unit.test_basic" name="test_no_ui"><failure message="assert 404 == 200">x</failure></testcase>
<testcase classname="unit.test_basic" name="test_addr"><failure message="RuntimeError: Server process died with return code 2">x</failure>
<system-out>tests: starting server with: llama-server --host a,b
error: cannot listen on a,b: no such host name (--host)</system-out></testcase>
<testcase classname="unit.test_basic" name="test_skip"><skipped message="needs GPU" /></testcase>
<testcase classname="unit.test_basic" name="test_load_split_model"><failure message="AssertionError: assert False">x</failure></testcase>
<testcase classname="unit.test_completion" name="test_completion_n_predict[256-4-n_predict_vals0-expected_success0]"><failure message="assert 62 == 80">{UNIFIED}</failure></testcase>
<testcase classname="unit.test_tokenize" name="test_tokenize_with_bos" />
</testsuite></testsuites>"""


def _by_name(cases):
    return {c.nodeid.split("::")[1]: c for c in cases}


def test_outcomes_reasons_and_hollow_passes_come_from_the_report():
    cases = parse_junit(JUNIT, {"unit/test_basic.py::test_error_route": ["POST /infill"],
                                "unit/test_basic.py::test_no_ui": ["GET /", "GET /slots", "GET /slots"]})
    assert Counter(c.outcome for c in cases) == {"passed": 3, "failed": 4, "skipped": 1}
    by_name = _by_name(cases)
    assert by_name["test_no_ui"].reason == "missing endpoint: GET /slots" and by_name["test_no_ui"].kind == ""
    assert by_name["test_addr"].reason == "server exits at start: error: cannot listen on a,b: no such host name (--host)"
    assert by_name["test_error_route"].hollow == ["POST /infill"]
    assert by_name["test_ok"].hollow == []
    # a 404 the test itself asserts (no `/` with --no-webui) does not make its pass hollow
    no_ui = '<testsuite><testcase classname="unit.test_basic" name="test_no_ui" /></testsuite>'
    [passed] = parse_junit(no_ui, {"unit/test_basic.py::test_no_ui": ["GET /", "GET /props"]})
    assert passed.outcome == "passed" and passed.hollow == ["GET /props"]
    split = by_name["test_load_split_model"]  # in the out-of-reach table: its reason comes from there
    assert split.kind == "real weights" and "(little|girl)+" in split.reason
    unified = by_name["test_completion_n_predict[256-4-n_predict_vals0-expected_success0]"]  # not in the table
    assert unified.kind == "" and unified.statement == 'assert res.body["timings"]["predicted_n"] == n_predict'
    assert unified.reason.startswith("generates another number of tokens than the n_predict")


def test_the_failing_line_is_the_tests_own_not_a_library_frame():
    text = ("&gt;       server.lora_files = [download_file(LORA_FILE_URL)]\n\nunit/test_lora.py:14: \n"
            "&gt;               raise URLError(err)\nE   urllib.error.URLError: x\n\n"
            "/usr/lib/python3.11/urllib/request.py:1351: URLError").replace("&gt;", ">")
    assert failing_statement(text) == "server.lora_files = [download_file(LORA_FILE_URL)]"
    assert failing_statement("no frames at all") == ""


def test_a_named_difference_says_what_the_assertion_checks():
    status = 'assert res.status_code == 200'
    assert classify("assert 500 == 200", statement=status) == "status 500 where llama-server answers 200"
    assert classify("assert 200 != 200", statement="assert res.status_code != 200").startswith("accepted what")
    assert classify("assert 404 == 200", statement=status, routes=["POST /rerank"]) == "missing endpoint: POST /rerank"
    assert classify("assert False", statement='assert all(output_text.find(" " + tok + " ") == -1 for tok in exclude)'
                    ).startswith("logit_bias not applied")
    assert classify("assert 0 > 1", statement="assert len(progress) > 1").startswith("no prompt_progress")
    # the residue is named by the line that failed, never a bare "other"
    assert classify("assert 3 == 4", statement="assert len(res.body) == 4") == \
        "assertion not met: assert len(res.body) == 4"
    assert classify("KeyError: 'embedding'").startswith("a field the test reads is missing")
    assert classify("Failed: Timeout >90.0s") == "timeout"
    assert classify("something new") == "other: something new"
    assert classify("AssertionError: assert 'all red ' == 'box she far ... fox '").startswith("generated text differs")
    died = "RuntimeError: Server process died with return code 2"
    usage = "fake-llama-server: error: the following arguments are required: -m/--model (see fake-llama-server --help)"
    assert classify(died, usage) == ROUTER_MODE


def test_the_out_of_reach_table_matches_by_test_and_by_parameters():
    story = out_of_reach("unit/test_completion.py::test_completion[I believe the meaning of life is-8-(going|bed)+-18-8-False-False]")
    assert story is not None and story[0] == "real tokenizer"
    assert out_of_reach("unit/test_lora.py::test_lora_per_request")[0] == "download"  # file-wide key
    image = "unit/test_vision_api.py::test_vision_chat_completion[What is this:\\n-IMG_URL_1-True-(frog)+]"
    assert out_of_reach(image)[0] == "download"
    # the same test with an invalid image is a difference to close, not out of reach
    assert out_of_reach("unit/test_vision_api.py::test_vision_chat_completion[What is this:\\n-malformed-False-None]") is None
    assert out_of_reach("unit/test_ctx_shift.py::test_ctx_shift_disabled_short_prompt[-1-248-True]") is not None
    assert out_of_reach("unit/test_ctx_shift.py::test_ctx_shift_disabled_short_prompt[32-32-False]") is None
    assert out_of_reach("unit/test_completion.py::test_completion_stream_vs_non_stream") is None  # no prefix match
    assert all(kind in KINDS and detail for kind, detail in OUT_OF_REACH.values())


def test_the_report_separates_out_of_reach_from_open_differences_and_says_when_no_pass_is_hollow():
    section = render({"unit/test_basic.py": parse_junit(JUNIT)}, "python -m bench.llamacpp_suite")
    assert "**3 passed, 4 failed, 0 errors, 1 skipped of 8**" in section
    assert "**Hollow passes: none**" in section
    assert "| unit/test_basic.py | 3 | 4 | 0 | 1 |" in section
    assert "**Out of reach (real weights/text, downloads, container runtime): 1** (real weights 1)." in section
    assert "| real weights | regex (little\\|girl)+ on the split stories15M's story text | 1 |" in section
    assert "**Named differences still open: 3**" in section
    assert "| missing endpoint (404) | 1 |" in section
    # a pass of a test the table calls out of reach is listed for a look, and every failure keeps its line
    assert "- `unit/test_tokenize.py::test_tokenize_with_bos`" in section
    assert "- `unit/test_basic.py::test_load_split_model` (out of reach, real weights: " in section
    hollow = render({"unit/test_basic.py": parse_junit(JUNIT, {"unit/test_basic.py::test_ok": ["POST /infill"]})}, "c")
    assert "**Hollow passes: 1**" in hollow and "`unit/test_basic.py::test_ok`: POST /infill" in hollow


def test_the_section_is_replaced_in_place_and_appended_when_absent():
    section = render({"unit/test_basic.py": parse_junit(JUNIT)}, "python -m bench.llamacpp_suite")
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
