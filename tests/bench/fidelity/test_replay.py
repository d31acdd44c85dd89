"""The fidelity harness: every capture, error row, metric family and SDK call of the real engines
counted against the look-alikes."""

from __future__ import annotations

from bench.fidelity.harness import ACCEPTED_METRICS, LORA_RUN, run
from bench.fidelity.items import Item, summary
from bench.fidelity.replay import ACCEPTED, body_shape, index_rows, shape
from bench.fidelity.sdk import CALLS
from bench.fidelity.tables import error_items, error_rows, exported_families, metric_items


def test_every_capture_error_row_metric_family_and_sdk_call_matches_or_is_an_accepted_difference():
    items = run()
    counts = summary(items)
    runs = ("vllm", "llama.cpp", LORA_RUN, "vllm/slow-model", "llama.cpp/slow-model")
    assert counts["capture"]["matched"] + counts["capture"]["accepted"] == sum(len(index_rows(r)) for r in runs) >= 150
    assert sum(counts["error"].values()) == len(error_rows()) == 50
    assert sum(counts["metric"].values()) >= 100
    assert sum(counts["sdk"].values()) == sum(len(c) for c in CALLS.values()) == 12
    not_matched = [(i.kind, i.engine, i.name, i.detail) for i in items if i.verdict in ("differs", "missing")]
    assert not_matched == []
    assert counts["total"]["accepted"] <= len(ACCEPTED) + len(ACCEPTED_METRICS)


def test_the_shape_sees_a_missing_key_a_changed_type_and_a_missing_metric_family():
    assert shape({"a": 1, "b": [{"c": None}]}) == shape({"b": [{"c": None}, {"c": None}], "a": 2.5})
    assert shape({"a": 1}) != shape({"a": 1, "b": 2}) and shape({"a": 1}) != shape({"a": "1"})
    metrics = "# TYPE vllm:x counter\nvllm:x 1\n# TYPE http_requests_total counter\n"
    assert body_shape("text/plain", metrics) != body_shape("text/plain", "# TYPE vllm:x counter\nvllm:x 1\n")
    stream = 'data: {"a": 1}\n\ndata: {"a": 2}\n\ndata: {"b": 1}\n\ndata: [DONE]\n\n'
    assert body_shape("text/event-stream", stream) == ("stream", (shape({"a": 1}), shape({"b": 1}), ("done",)))


def test_summary_counts_each_verdict_per_kind_and_in_total():
    items = [Item("vllm", "a", "matched"), Item("vllm", "b", "differs", kind="metric"),
             Item("llama.cpp", "c", "missing", kind="metric"), Item("vllm", "d", "accepted", kind="sdk")]
    counts = summary(items)
    assert counts["metric"] == {"matched": 0, "accepted": 0, "differs": 1, "missing": 1}
    assert counts["total"] == {"matched": 1, "accepted": 1, "differs": 1, "missing": 1}
    assert sum(counts["error"].values()) == 0


def test_an_error_row_takes_its_captures_verdict_and_is_missing_without_a_capture():
    table = ("| case | vLLM status | vLLM body | llama-server status | llama-server body |\n|---|---|---|---|---|\n"
             "| version | 200 OK | `{}` | 404 Not Found | `{}` |\n| err_x | 400 Bad Request | `` | 500 Oops | `` |\n")
    rows = error_rows(table)
    assert rows == [("vllm", "version", 200), ("vllm", "err_x", 400), ("llama.cpp", "version", 404),
                    ("llama.cpp", "err_x", 500)]
    captures = [Item("vllm", "005_version", "matched"), Item("vllm", "040_err_x", "differs", "body shape"),
                Item("llama.cpp", "005_version", "matched")]
    statuses = {("vllm", "005_version"): 200, ("vllm", "040_err_x"): 400, ("llama.cpp", "005_version"): 200}
    got = [(i.verdict, i.kind) for i in error_items(rows, captures, statuses)]
    assert got == [("matched", "error"), ("differs", "error"), ("differs", "error"), ("missing", "error")]


def test_a_metric_family_matches_on_name_type_and_label_names_only():
    real = ('# TYPE h histogram\nh_bucket{handler="/a",le="1"} 1\nh_sum{handler="/a"} 1\nh_count{handler="/a"} 1\n'
            '# TYPE c_total counter\nc_total{engine="0"} 1\n# TYPE c_created gauge\nc_created{engine="0"} 1\n'
            '# TYPE g gauge\ng 3\n')
    assert exported_families(real) == {"h": ("histogram", frozenset({"handler"})),
                                       "c_total": ("counter", frozenset({"engine"})),
                                       "c_created": ("gauge", frozenset({"engine"})), "g": ("gauge", frozenset())}
    fake = ('# TYPE h histogram\nh_bucket{handler="/b",le="5"} 9\n# TYPE c_total counter\nc_total{model="m"} 1\n'
            '# TYPE g counter\ng 3\n')
    verdicts = {i.name: i.verdict for i in metric_items("vllm", real, fake, {("vllm", "g"): "why"})}
    assert verdicts == {"h": "matched", "c_total": "differs", "c_created": "missing", "g": "accepted"}
    assert [i.name for i in metric_items("vllm", real, fake, {}, counted={"h", "c_total", "g"})] == ["c_created"]
