"""fake-vllm's structured outputs (structured_outputs, response_format) over a real socket."""

from __future__ import annotations

import json
import re

import jsonschema

from tests.fake_engines.client import post_json


def test_structured_outputs_and_response_format_shape_the_text_and_end_it(engine):
    base, chat = engine.base_url, {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 60}
    schema = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Lima"]}}, "required": ["city"],
              "additionalProperties": False}
    asks = [({"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}},
             lambda t: jsonschema.validate(json.loads(t), schema) is None),
            ({"structured_outputs": {"choice": ["yes", "no"]}}, lambda t: t in ("yes", "no")),
            ({"structured_outputs": {"regex": r"[0-9]{3}-[a-z]{2}"}}, lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t)),
            ({"structured_outputs": {"grammar": 'root ::= "x" [ab]{2}'}}, lambda t: re.fullmatch("x[ab]{2}", t)),
            ({"response_format": {"type": "json_object"}}, lambda t: isinstance(json.loads(t), dict))]
    for extra, conforms in asks:
        status, body = post_json(base, "/v1/chat/completions", {**chat, **extra, "seed": 7})
        choice = body["choices"][0]
        assert status == 200 and conforms(choice["message"]["content"]) and choice["finish_reason"] == "stop", body
        again = post_json(base, "/v1/chat/completions", {**chat, **extra, "seed": 7})[1]["choices"][0]
        assert again["message"]["content"] == choice["message"]["content"]  # the same seed, the same text
    status, body = post_json(base, "/v1/completions", {"model": "tiny-llama", "prompt": "x", "max_tokens": 5,
                                                       "structured_outputs": {"choice": ["a"], "regex": "b"}})
    assert status == 400 and "only use one kind of structured outputs" in body["error"]["message"]
