"""Vertex AI compatibility (AIP_MODE=PREDICTION) as llama-server's register_gcp_compat has it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from fake_engines.llamacpp.config import LlamaServerConfig
from fake_engines.llamacpp.gcp import gcp_alias, gcp_port, gcp_settings
from fake_engines.llamacpp.server import start_llama
from tests.fake_engines.client import post_json
from tests.fake_engines.engine_thread import EngineThread


def test_settings_aliases_and_port_follow_the_aip_environment():
    settings = gcp_settings({"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "v1/predict", "AIP_HTTP_PORT": "9000"})
    assert (settings.enabled, settings.predict_path, settings.health_path, settings.port) == \
        (True, "/v1/predict", "", 9000)
    assert not gcp_settings({}).enabled and gcp_settings({}).predict_path == "/predict"
    assert gcp_port(LlamaServerConfig(model="m"), {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "9000"}).port == 9000
    assert gcp_port(LlamaServerConfig(model="m"), {"AIP_HTTP_PORT": "9000"}).port == 8080  # only in PREDICTION mode
    assert [gcp_alias(p) for p in ("/v1/chat/completions", "/apply-template", "/slots/{id_slot}", "/infill")] == \
        ["chatCompletions", "applyTemplate", "slots", "infill"]


def test_predict_runs_each_instance_through_its_route_and_answers_every_one(monkeypatch):
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/ping")
    config = LlamaServerConfig(model="llama-3.2-1b-Q8_0.gguf", port=0, time_scale=0.01, n_parallel=2)
    with EngineThread(lambda: start_llama(config, cold_start=False)) as engine:
        instances = [{"@requestFormat": "chatCompletions", "max_tokens": 4, "stream": True,
                      "messages": [{"role": "user", "content": "Say hello"}]},
                     {"@requestFormat": "/tokenize", "content": "abcd"}, {"@requestFormat": "nope"}, 3,
                     {"@requestFormat": "chatCompletions"}]
        status, body = post_json(engine.base_url, "/predict", json.dumps({"instances": instances}).encode())
        chat, tokens, unknown, not_object, bad_chat = body["predictions"]
        assert status == 200 and chat["choices"][0]["message"]["role"] == "assistant"  # never streamed
        assert chat["usage"]["completion_tokens"] == 4 and tokens == {"tokens": [tokens["tokens"][0]]}
        assert unknown["error"]["message"] == "no handler registered for @requestFormat: nope"
        assert not_object["error"]["message"] == "each instance must be a JSON object"
        assert bad_chat["error"]["code"] == 400  # the route's own error, as a prediction
        for raw, words in ((b"{x", "parse error"), (b"[]", "must be a JSON object"), (b"{}", "named instances"),
                           (json.dumps({"instances": [{}] * 129}).encode(), "maximum size of 128")):
            status, error = post_json(engine.base_url, "/predict", raw)
            assert status == 400 and words in error["error"]["message"], raw
        with urllib.request.urlopen(engine.base_url + "/ping", timeout=10) as resp:
            assert json.loads(resp.read()) == {"status": "ok"}
