"""A generation request read into what to forward (proxy/generation.py)."""

from __future__ import annotations

import json

import pytest

from proxy.generation import with_usage_asked


@pytest.mark.parametrize("body", [
    {"prompt": "x" * 1000, "stream": True},
    {"prompt": "x", "stream": True, "stream_options": None},
    {"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": False}},
])
@pytest.mark.parametrize("encoding,trailer", [("utf-8", b""), ("utf-8", b" \r\n"), ("utf-16-le", b""),
                                              ("utf-16-be", b""), ("utf-32-be", b"")])
def test_usage_is_asked_for_with_the_other_members_kept(body: dict, encoding: str, trailer: bytes) -> None:
    raw = json.dumps(body).encode(encoding) + trailer
    sent = json.loads(with_usage_asked(raw, json.loads(raw)))
    assert sent == {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
