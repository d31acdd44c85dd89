"""fake-vllm's http_* families against a real vLLM 0.32 scrape: names, help, types, labels,
buckets, family order, which requests count under which handler, sizes from Content-Length."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DATA
from tests.fake_engines.scrape import fetch_text

CAPTURE = DATA / "real-engines" / "vllm" / "029_metrics_after_basic_requests.http"


def _call(base: str, method: str, path: str, body: bytes | None = None) -> int:
    req = urllib.request.Request(base + path, data=body, method=method,
                                 headers={"Content-Type": "application/json"} if body is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as err:
        err.read()
        return err.code


def _http_families(text: str) -> list:
    return [f for f in text_string_to_metric_families(text) if f.name.startswith("http_")]


def _outline(families: list) -> list[tuple]:
    out = []
    for fam in families:
        labels = sorted({k for s in fam.samples for k in s.labels if k != "le"})
        bounds = tuple(dict.fromkeys(s.labels["le"] for s in fam.samples if s.name.endswith("_bucket")))
        out.append((fam.name, fam.type, fam.documentation, tuple(labels), bounds))
    return out


def _requests_total(families: list) -> dict[tuple[str, str, str], float]:
    fam = next(f for f in families if f.name == "http_requests")
    return {(s.labels["handler"], s.labels["method"], s.labels["status"]): s.value for s in fam.samples
            if s.name == "http_requests_total"}


def test_http_families_count_requests_as_the_real_server_did(engine):
    base = engine.base_url
    completion = json.dumps({"model": "tiny-llama", "prompt": "Hello world", "max_tokens": 3}).encode()
    chat = json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                       "stream": True}).encode()
    tokenize = json.dumps({"model": "tiny-llama", "prompt": "Hello"}).encode()
    # the capture's sequence before its scrape: excluded routes, models, tokenize, the 404 and 405, generation
    calls = [("GET", "/health", None), ("HEAD", "/health", None), ("GET", "/v1/models", None),
             ("GET", "/version", None), ("GET", "/load", None), ("GET", "/ping", None)]
    calls += [("POST", "/tokenize", tokenize)] * 3 + [("POST", "/detokenize", json.dumps({"tokens": [1, 2]}).encode())]
    calls += [("GET", "/v1/does-not-exist", None), ("GET", "/v1/completions", None)]
    calls += [("POST", "/v1/completions", completion)] * 2 + [("POST", "/v1/chat/completions", chat)]
    for method, path, body in calls:
        _call(base, method, path, body)
    ours = _http_families(fetch_text(base))
    real = _http_families(CAPTURE.read_text(encoding="utf-8", errors="replace").split("\n\n", 1)[1])
    assert _outline(ours) == _outline(real)  # order, help, type, labels, buckets
    assert set(_requests_total(ours)) == set(_requests_total(real))
    counts = _requests_total(ours)
    assert counts[("none", "GET", "4xx")] == 2 and counts[("/tokenize", "POST", "2xx")] == 3
    sizes = {(f.name, s.labels["handler"]): s.value for f in ours for s in f.samples if s.name.endswith("_sum")
             and f.name in ("http_request_size_bytes", "http_response_size_bytes")}
    assert sizes[("http_request_size_bytes", "/v1/completions")] == 2 * len(completion)
    assert sizes[("http_response_size_bytes", "/v1/chat/completions")] == 0  # streamed: no Content-Length
    assert sizes[("http_response_size_bytes", "/v1/completions")] > 0
