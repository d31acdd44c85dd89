"""Error rows and metric families as fidelity items."""

from __future__ import annotations

from bench.fidelity.items import Item
from bench.fidelity.tables import error_items, error_rows, exported_families, metric_items


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
