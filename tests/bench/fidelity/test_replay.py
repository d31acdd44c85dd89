"""The capture replay's comparison: the shape of a body, a stream and a metrics page."""

from __future__ import annotations

from bench.fidelity.replay import body_shape, shape


def test_the_shape_sees_a_missing_key_a_changed_type_and_a_missing_metric_family():
    assert shape({"a": 1, "b": [{"c": None}]}) == shape({"b": [{"c": None}, {"c": None}], "a": 2.5})
    assert shape({"a": 1}) != shape({"a": 1, "b": 2}) and shape({"a": 1}) != shape({"a": "1"})
    metrics = "# TYPE vllm:x counter\nvllm:x 1\n# TYPE http_requests_total counter\n"
    assert body_shape("text/plain", metrics) != body_shape("text/plain", "# TYPE vllm:x counter\nvllm:x 1\n")
    stream = 'data: {"a": 1}\n\ndata: {"a": 2}\n\ndata: {"b": 1}\n\ndata: [DONE]\n\n'
    assert body_shape("text/event-stream", stream) == ("stream", (shape({"a": 1}), shape({"b": 1}), ("done",)))
